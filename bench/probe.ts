/**
 * The in-process probe every server under test runs (the service and the HTTP peers alike,
 * so they are measured the same way): event-loop delay and peak RSS, reset and read by
 * the driver over IPC, and the process's CPU time in between.
 *
 * Peak RSS comes from the kernel's high-water mark (`VmHWM` in /proc/self/status), reset
 * by writing 5 to /proc/self/clear_refs: a stall on the main thread cannot hide a peak
 * from it, as it would from a timer. Where that is not available, a 20 ms sampler stands in.
 *
 * CPU time by thread (Linux): each thread's `utime + stime` from /proc/self/task/<tid>/stat,
 * as the main thread (tid = pid), the validation workers (the tids the server names), and the
 * rest (libuv's pool: file writes, zlib; V8's GC helpers; threads that ended meanwhile).
 */
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import type { ProbeSample, ServerCommand, ServerEvent } from './protocol.js';

const SAMPLE_MS = 20;

export interface Probe {
  reset(): void;
  read(): ProbeSample;
  stop(): void;
}

/** CPU ms per thread id, now. Empty where /proc is not there. */
function threadTimes(): Map<number, number> {
  const times = new Map<number, number>();
  let tids: string[];
  try {
    tids = readdirSync('/proc/self/task');
  } catch {
    return times;
  }
  for (const tid of tids) {
    try {
      const stat = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      // After the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime, in clock ticks (10 ms).
      times.set(Number(tid), (Number(fields[11]) + Number(fields[12])) * 10);
    } catch {
      // The thread ended between the listing and the read.
    }
  }
  return times;
}

/** `workerTids`: the kernel ids of the server's worker threads (the service's validation pool), if any. */
export function startProbe(workerTids: () => number[] = () => []): Probe {
  const eld = monitorEventLoopDelay({ resolution: 1 });
  eld.enable();
  let sampledPeak = process.memoryUsage.rss();
  const timer = setInterval(() => {
    sampledPeak = Math.max(sampledPeak, process.memoryUsage.rss());
  }, SAMPLE_MS);
  timer.unref();
  let hwm = resetHighWaterMark();
  let cpu = process.cpuUsage();
  let threads = threadTimes();

  return {
    reset() {
      eld.reset();
      cpu = process.cpuUsage();
      threads = threadTimes();
      hwm = resetHighWaterMark();
      sampledPeak = process.memoryUsage.rss();
    },
    read() {
      const rss = process.memoryUsage.rss();
      sampledPeak = Math.max(sampledPeak, rss);
      const kernelPeak = hwm ? highWaterMark() : null;
      const used = process.cpuUsage(cpu);
      const cpuMs = (used.user + used.system) / 1000;
      const now = threadTimes();
      const spent = (tid: number) => (now.get(tid) ?? 0) - (threads.get(tid) ?? 0);
      const workers = new Set(workerTids());
      let workerMs = 0;
      for (const tid of now.keys()) if (workers.has(tid)) workerMs += spent(tid);
      const mainMs = spent(process.pid);
      return {
        eldMaxMs: eld.max / 1e6,
        eldP99Ms: eld.percentile(99) / 1e6,
        peakRssBytes: Math.max(kernelPeak ?? 0, sampledPeak),
        cpuMs,
        cpuByThread: now.size === 0 ? null : { mainMs, workersMs: workerMs, otherMs: Math.max(0, cpuMs - mainMs - workerMs) },
        rssBytes: rss,
        peakSource: kernelPeak === null ? 'sampled' : 'vmhwm',
      };
    },
    stop() {
      clearInterval(timer);
      eld.disable();
    },
  };
}

/**
 * Answers the driver's probe commands and calls `onStop` on `stop`, on SIGTERM/SIGINT,
 * or when the driver goes away (IPC disconnect), so no server outlives its run.
 */
export function serveProbe(probe: Probe, onStop: () => Promise<void>): void {
  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    probe.stop();
    onStop().then(
      () => {
        if (process.connected) process.disconnect();
      },
      (err: unknown) => {
        console.error('bench: server failed to stop cleanly', err);
        process.exitCode = 1;
        if (process.connected) process.disconnect();
      },
    );
  };
  process.on('message', (msg: ServerCommand) => {
    if (msg.type === 'probe-reset') probe.reset();
    else if (msg.type === 'probe-read') send({ type: 'probe', sample: probe.read() });
    else if (msg.type === 'stop') stop();
  });
  process.on('disconnect', stop);
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

export function send(event: ServerEvent): void {
  process.send?.(event);
}

function resetHighWaterMark(): boolean {
  try {
    writeFileSync('/proc/self/clear_refs', '5');
    return highWaterMark() !== null;
  } catch {
    return false;
  }
}

function highWaterMark(): number | null {
  try {
    const m = /^VmHWM:\s+(\d+)\s+kB$/m.exec(readFileSync('/proc/self/status', 'utf8'));
    return m ? Number(m[1]) * 1024 : null;
  } catch {
    return null;
  }
}
