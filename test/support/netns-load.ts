/**
 * The clients of the network drill, run on a host of their own (`ip netns exec <clients> node
 * netns-load.js`): lanes that send packages one after the other to their gateway, and a status
 * probe per gateway, every answer written to stdout as one JSON line, until stdin closes. The
 * drill (test/drills/network-faults.test.ts) sends the plan as the first line of stdin and
 * judges the answers; this process only records them.
 *
 * Lanes 2, 3, 6, 7, … (on both gateways, in both sessions) retry as a client with an
 * `Idempotency-Key` does (docs/api.md, "Idempotent retries"): each package carries a key of its
 * own, and an answer that is not 200 (a 503, a 409 in progress, a timeout, a failed connection)
 * is retried with the same key and body on the other gateway (a client behind a load
 * balancer), until a 200 or a client error; once stdin closes a keyed lane still finishes its
 * package, for up to `finishMs`. The other lanes send each package once, without a key.
 */
import { createInterface } from 'node:readline';
import { Agent, request } from 'undici';
import { drillPackage } from './drills.js';

export interface LoadPlan {
  gateways: string[];
  sessions: { client: { id: string; token: string }; uuid: string }[];
  /** Lane `i` sends to `gateways[i % n]`, in `sessions[i % m]`. */
  lanes: number;
  rows: number;
  /** A lane waits this long between its packages: the load's pace, not a wait for anything. */
  paceMs: number;
  /** No answer within this long is a hang (the drill sets it past the gateway's request timeout). */
  timeoutMs: number;
  /** Each gateway's status is asked this often (of `sessions[0]`), whether the last probe was answered or not. */
  statusEveryMs: number;
  /** How long a keyed lane keeps retrying its package after stdin closed. */
  finishMs: number;
}

/** One answer: `t` is `i` (an ingest) or `s` (a status probe); `at` when it was sent (epoch ms). */
export interface LoadLine {
  t: 'i' | 's';
  gw: number;
  at: number;
  ms: number;
  /** The HTTP status, or `timeout` (no answer within `timeoutMs`), or `error:<code>` (the connection failed). */
  status: number | string;
  /** The package (`L<lane>/<k>`), ingests only. */
  pkg?: string;
  /** The package's `Idempotency-Key` (keyed lanes), and which attempt this answer was (1 for the first). */
  key?: string;
  attempt?: number;
  body?: string;
  retryAfter?: string | null;
  /** `Idempotent-Replayed: true`: the answer of an earlier attempt. */
  replayed?: boolean;
}

/** What `ask` records of one request. */
type Answer = Pick<LoadLine, 'at' | 'ms' | 'status' | 'body' | 'retryAfter' | 'replayed'>;

const API = '/api/v1/uploading';
const IN_PROGRESS = 'A request with this Idempotency-Key is in progress';

async function main(): Promise<void> {
  const input = createInterface({ input: process.stdin });
  const lines = input[Symbol.asyncIterator]();
  const first = await lines.next();
  if (first.done) return;
  const plan = JSON.parse(first.value) as LoadPlan;
  let stopping = false;
  let stoppedAt = Infinity;
  const stopped = (async () => {
    for (;;) if ((await lines.next()).done) break;
    stopping = true;
    stoppedAt = Date.now();
  })();
  // Connections of their own per lane: a cut gateway's stuck sockets must not hold another's requests.
  const agent = new Agent({ connections: 64, headersTimeout: plan.timeoutMs, bodyTimeout: plan.timeoutMs });
  const write = (line: LoadLine): void => void process.stdout.write(`${JSON.stringify(line)}\n`);

  const ask = async (gw: number, method: 'GET' | 'POST', path: string, client: { id: string; token: string }, body?: unknown, key?: string): Promise<Answer> => {
    const at = Date.now();
    const t0 = performance.now();
    try {
      const res = await request(plan.gateways[gw]! + path, {
        method,
        dispatcher: agent,
        headers: {
          authorization: client.token,
          'client-id': client.id,
          ...(body ? { 'content-type': 'application/json' } : {}),
          ...(key ? { 'idempotency-key': key } : {}),
        },
        body: body ? JSON.stringify(body) : undefined,
        signal: AbortSignal.timeout(plan.timeoutMs),
      });
      const text = await res.body.text();
      const retryAfter = res.headers['retry-after'];
      return {
        at,
        ms: Math.round(performance.now() - t0),
        status: res.statusCode,
        body: text.slice(0, 300),
        retryAfter: typeof retryAfter === 'string' ? retryAfter : null,
        ...(res.headers['idempotent-replayed'] === 'true' ? { replayed: true } : {}),
      };
    } catch (err) {
      const e = err as { name?: string; code?: string };
      const status = e.name === 'TimeoutError' || e.code === 'UND_ERR_HEADERS_TIMEOUT' || e.code === 'UND_ERR_BODY_TIMEOUT' ? 'timeout' : `error:${e.code ?? e.name}`;
      return { at, ms: Math.round(performance.now() - t0), status };
    }
  };

  const pace = (ms: number) => new Promise((r) => setTimeout(r, ms));
  const lane = async (i: number): Promise<void> => {
    const gw = i % plan.gateways.length;
    const s = plan.sessions[i % plan.sessions.length]!;
    const keyed = Math.floor(i / 2) % 2 === 1;
    for (let k = 0; !stopping; k++) {
      const pkg = `L${i}/${k}`;
      const body = drillPackage(`L${i}`, k, plan.rows);
      if (!keyed) {
        write({ t: 'i', gw, pkg, ...(await ask(gw, 'POST', `${API}/${s.uuid}/products`, s.client, body)) });
      } else {
        const key = `drill-${i}-${k}`;
        for (let attempt = 1; ; attempt++) {
          const to = (gw + attempt - 1) % plan.gateways.length;
          const answer = await ask(to, 'POST', `${API}/${s.uuid}/products`, s.client, body, key);
          write({ t: 'i', gw: to, pkg, key, attempt, ...answer });
          const again = typeof answer.status !== 'number' || answer.status >= 500 || (answer.status === 409 && answer.body?.includes(IN_PROGRESS));
          if (!again || Date.now() > stoppedAt + plan.finishMs) break;
          await pace(plan.paceMs);
        }
      }
      if (!stopping) await pace(plan.paceMs);
    }
  };
  // Probes go out on the clock, not one after the other: a probe that hangs does not hide the ones behind it.
  const probe = async (gw: number): Promise<void> => {
    const s = plan.sessions[0]!;
    const out = new Set<Promise<void>>();
    while (!stopping) {
      if (out.size < 100) {
        const p: Promise<void> = ask(gw, 'GET', `${API}/${s.uuid}/status`, s.client).then((answer) => {
          write({ t: 's', gw, ...answer, body: answer.status === 200 ? undefined : answer.body });
          out.delete(p);
        });
        out.add(p);
      }
      await new Promise((r) => setTimeout(r, plan.statusEveryMs));
    }
    await Promise.all(out);
  };
  await Promise.all([...Array.from({ length: plan.lanes }, (_, i) => lane(i)), ...plan.gateways.map((_, gw) => probe(gw)), stopped]);
  await agent.close();
  process.stdout.write(`${JSON.stringify({ t: 'done' })}\n`);
}

await main();
