/**
 * A load client process: keeps the run's bodies resident and, on the driver's word,
 * either sends ingest requests from `slots` concurrent loops or polls a status URL at a
 * fixed interval, timing every request with undici. Running in its own process keeps the
 * client's CPU out of the server's event loop.
 *
 * Protocol (protocol.ts): load → loaded; arm → armed; go → … → result; stop ends a poll.
 */
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { Agent, request } from 'undici';
import type { ClientCommand, ClientEvent, IngestJob, PollJob, RequestSamples } from './protocol.js';

/** Hard bound of one poll job's requests, whatever its duration. */
const MAX_POLLS = 200_000;
const MAX_FAILURES = 5;

const now = () => performance.timeOrigin + performance.now();
const bodies = new Map<string, Buffer>();
let armed: { job: IngestJob | PollJob; agent: Agent } | null = null;
let stopped = false;

function emit(event: ClientEvent): void {
  process.send?.(event);
}

class Recorder {
  readonly start: number[] = [];
  readonly end: number[] = [];
  readonly status: number[] = [];
  readonly rows: number[] = [];
  readonly failures: string[] = [];

  add(start: number, end: number, status: number, rows: number, failure?: string): void {
    this.start.push(start);
    this.end.push(end);
    this.status.push(status);
    this.rows.push(rows);
    if (failure !== undefined && this.failures.length < MAX_FAILURES && !this.failures.includes(failure)) this.failures.push(failure);
  }

  samples(): RequestSamples {
    return {
      start: Float64Array.from(this.start),
      end: Float64Array.from(this.end),
      status: Int32Array.from(this.status),
      rows: Float64Array.from(this.rows),
      failures: this.failures,
    };
  }
}

async function timed(
  rec: Recorder,
  agent: Agent,
  url: string,
  opts: { method: 'GET' | 'POST'; headers: Record<string, string>; body?: Buffer },
): Promise<void> {
  const start = now();
  try {
    const res = await request(url, { ...opts, dispatcher: agent });
    const text = await res.body.text();
    const end = now();
    if (res.statusCode !== 200) {
      rec.add(start, end, res.statusCode, 0, `${res.statusCode} ${text.slice(0, 200)}`);
      return;
    }
    let rows = 0;
    if (opts.method === 'POST') {
      const parsed = JSON.parse(text) as { rows_processed?: unknown };
      rows = typeof parsed.rows_processed === 'number' ? parsed.rows_processed : 0;
    }
    rec.add(start, end, 200, rows);
  } catch (err) {
    const e = err as { code?: string; message?: string };
    rec.add(start, now(), 0, 0, `no answer: ${e.code ?? ''} ${e.message ?? String(err)}`.trim());
  }
}

async function runIngest(job: IngestJob, agent: Agent): Promise<RequestSamples> {
  const body = bodies.get(job.body);
  if (!body) throw new Error(`body ${job.body} was not loaded`);
  const rec = new Recorder();
  const deadline = now() + job.durationMs;
  const url = job.origin + job.path;
  const loop = async () => {
    for (let i = 0; i < job.maxRequests; i++) {
      if (i > 0 && (now() >= deadline || stopped)) break;
      await timed(rec, agent, url, { method: 'POST', headers: job.headers, body });
    }
  };
  await Promise.all(Array.from({ length: job.slots }, loop));
  return rec.samples();
}

async function runPoll(job: PollJob, agent: Agent): Promise<RequestSamples> {
  const rec = new Recorder();
  const deadline = now() + job.maxMs;
  const url = job.origin + job.path;
  let next = now();
  for (let i = 0; i < MAX_POLLS && !stopped && now() < deadline; i++) {
    const wait = next - now();
    if (wait > 0) await sleep(wait);
    // A late answer does not make the poller burst to catch up.
    next = Math.max(next + job.intervalMs, now());
    await timed(rec, agent, url, { method: 'GET', headers: job.headers });
  }
  return rec.samples();
}

async function go(): Promise<void> {
  if (!armed) throw new Error('go before arm');
  const { job, agent } = armed;
  armed = null;
  try {
    const samples = job.kind === 'ingest' ? await runIngest(job, agent) : await runPoll(job, agent);
    emit({ type: 'result', id: job.id, samples });
  } finally {
    await agent.close();
  }
}

function fail(err: unknown): void {
  emit({ type: 'failed', message: err instanceof Error ? err.stack ?? err.message : String(err) });
}

process.on('message', (msg: ClientCommand) => {
  switch (msg.type) {
    case 'load':
      try {
        for (const ref of msg.bodies) if (!bodies.has(ref.name)) bodies.set(ref.name, readFileSync(ref.path));
        emit({ type: 'loaded' });
      } catch (err) {
        fail(err);
      }
      break;
    case 'arm': {
      const timeout = msg.job.kind === 'ingest' ? msg.job.requestTimeoutMs : 30_000;
      stopped = false;
      armed = {
        job: msg.job,
        agent: new Agent({ headersTimeout: timeout, bodyTimeout: timeout, keepAliveTimeout: 10_000, connectTimeout: 10_000 }),
      };
      emit({ type: 'armed', id: msg.job.id });
      break;
    }
    case 'go':
      go().catch(fail);
      break;
    case 'stop':
      stopped = true;
      break;
  }
});
// An orphaned client has nothing left to report to.
process.on('disconnect', () => process.exit(0));
