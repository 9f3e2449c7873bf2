/**
 * A load client process: keeps the run's bodies resident and, on the driver's word,
 * either sends ingest requests from `slots` concurrent loops or polls a status URL at a
 * fixed interval, timing every request made with the client library (`src/client`, on
 * undici). Running in its own process keeps the client's CPU out of the server's event loop.
 *
 * Protocol (protocol.ts): load → loaded; arm → armed; go → … → result; stop ends a poll.
 */
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { IngestClient } from '../src/client/client.js';
import { describeDetail, isApiError, isClientError } from '../src/client/errors.js';
import type { ClientCommand, ClientEvent, IngestJob, PollJob, RequestSamples } from './protocol.js';

/** Hard bound of one poll job's requests, whatever its duration. */
const MAX_POLLS = 200_000;
const MAX_FAILURES = 5;

const now = () => performance.timeOrigin + performance.now();
const bodies = new Map<string, Buffer>();
let armed: { job: IngestJob | PollJob; client: IngestClient } | null = null;
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

  samples(cpuMs: number): RequestSamples {
    return {
      cpuMs,
      start: Float64Array.from(this.start),
      end: Float64Array.from(this.end),
      status: Int32Array.from(this.status),
      rows: Float64Array.from(this.rows),
      failures: this.failures,
    };
  }
}

/** Times one call; `call` resolves with the rows the service processed (0 for a status poll). */
async function timed(rec: Recorder, call: () => Promise<number>): Promise<void> {
  const start = now();
  try {
    const rows = await call();
    rec.add(start, now(), 200, rows);
  } catch (err) {
    const end = now();
    if (isApiError(err)) rec.add(start, end, err.status, 0, `${err.status} ${describeDetail(err.body).slice(0, 200)}`);
    else if (isClientError(err) && err.status !== null) rec.add(start, end, err.status, 0, err.message.slice(0, 200));
    else {
      const e = err as { code?: string; cause?: { code?: string }; message?: string };
      rec.add(start, end, 0, 0, `no answer: ${e.cause?.code ?? e.code ?? ''} ${e.message ?? String(err)}`.trim());
    }
  }
}

async function runIngest(job: IngestJob, client: IngestClient): Promise<RequestSamples> {
  const body = bodies.get(job.body);
  if (!body) throw new Error(`body ${job.body} was not loaded`);
  const rec = new Recorder();
  const cpu = process.cpuUsage();
  const deadline = now() + job.durationMs;
  const opts = job.gzip ? ({ contentEncoding: 'gzip' } as const) : {};
  const loop = async () => {
    for (let i = 0; i < job.maxRequests; i++) {
      if (i > 0 && (now() >= deadline || stopped)) break;
      await timed(rec, async () => (await client.ingest(job.uploadUuid, job.entity, body, opts)).rows_processed);
    }
  };
  await Promise.all(Array.from({ length: job.slots }, loop));
  const used = process.cpuUsage(cpu);
  return rec.samples((used.user + used.system) / 1000);
}

async function runPoll(job: PollJob, client: IngestClient): Promise<RequestSamples> {
  const rec = new Recorder();
  const deadline = now() + job.maxMs;
  let next = now();
  for (let i = 0; i < MAX_POLLS && !stopped && now() < deadline; i++) {
    const wait = next - now();
    if (wait > 0) await sleep(wait);
    // A late answer does not make the poller burst to catch up.
    next = Math.max(next + job.intervalMs, now());
    await timed(rec, async () => {
      await client.status(job.uploadUuid);
      return 0;
    });
  }
  return rec.samples(Number.NaN);
}

async function go(): Promise<void> {
  if (!armed) throw new Error('go before arm');
  const { job, client } = armed;
  armed = null;
  try {
    const samples = job.kind === 'ingest' ? await runIngest(job, client) : await runPoll(job, client);
    emit({ type: 'result', id: job.id, samples });
  } finally {
    await client.close();
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
        // No pacing: the bench measures the service, whose admission limits it turns off.
        client: new IngestClient({
          baseUrl: msg.job.origin,
          clientId: msg.job.credentials.id,
          token: msg.job.credentials.token,
          timeoutMs: timeout,
          ingestTimeoutMs: timeout,
          connectTimeoutMs: 10_000,
          connections: msg.job.kind === 'ingest' ? msg.job.slots : 1,
          requestsPerSecond: 0,
        }),
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
