/**
 * A load process of the packages bench (packages.ts): on the driver's word, sends one body
 * from `lanes` concurrent loops, each loop against its session, until `count` packages are
 * sent in all or `untilMs` (epoch) has passed; records the start and end of every request
 * and every non-200. Keeping the client in its own process keeps its CPU out of the server's.
 */
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { Agent, request } from 'undici';

export interface PackagesJob {
  url: string;
  bodyFile: string;
  entity: string;
  /** One entry per concurrent loop: the session it sends to and its credentials. */
  lanes: { uuid: string; clientId: string; token: string }[];
  /** Packages this process sends in all (shared by its lanes); 0 = until `untilMs`. */
  count: number;
  untilMs: number;
}

export interface PackagesResult {
  /** Per request: start and end (ms since the time origin of the driver's clock: epoch ms). */
  start: number[];
  end: number[];
  failures: Record<string, number>;
  cpuMs: number;
}

const now = () => performance.timeOrigin + performance.now();

process.on('message', (job: PackagesJob) => {
  void run(job).then(
    (result) => process.send?.({ type: 'result', result }),
    (err: unknown) => process.send?.({ type: 'error', message: err instanceof Error ? err.stack : String(err) }),
  );
});
process.send?.({ type: 'ready' });

async function run(job: PackagesJob): Promise<PackagesResult> {
  const body = readFileSync(job.bodyFile);
  const agent = new Agent({ connections: job.lanes.length, pipelining: 1, keepAliveTimeout: 30_000 });
  const result: PackagesResult = { start: [], end: [], failures: {}, cpuMs: 0 };
  const cpu = process.cpuUsage();
  let left = job.count > 0 ? job.count : Infinity;
  await Promise.all(
    job.lanes.map(async (lane) => {
      const url = `${job.url}/api/v1/uploading/${lane.uuid}/${job.entity}`;
      const headers = { authorization: lane.token, 'client-id': lane.clientId, 'content-type': 'application/json' };
      while (left > 0 && now() < job.untilMs) {
        left--;
        const start = now();
        try {
          const res = await request(url, { method: 'POST', headers, body, dispatcher: agent, headersTimeout: 600_000, bodyTimeout: 600_000 });
          const text = await res.body.text();
          result.start.push(start);
          result.end.push(now());
          if (res.statusCode !== 200) {
            const key = `${res.statusCode} ${text.slice(0, 200)}`;
            result.failures[key] = (result.failures[key] ?? 0) + 1;
          }
        } catch (err) {
          const key = err instanceof Error ? `${(err as { code?: string }).code ?? err.name}: ${err.message}` : String(err);
          result.failures[key] = (result.failures[key] ?? 0) + 1;
        }
      }
    }),
  );
  await agent.close();
  const used = process.cpuUsage(cpu);
  result.cpuMs = (used.user + used.system) / 1000;
  return result;
}
