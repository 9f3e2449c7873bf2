/**
 * One HTTP edge alone, in its own process, for `bench/edges.ts`: the edge core with the
 * adapter named in argv[2] (`uws` or `node`) and one streaming route, `POST /sink`, whose
 * body sink counts the bytes and drops them. What it measures is the edge: receive, limits,
 * back-pressure hooks, the answer — no validation. Sends `{type:'ready', url}` over IPC,
 * answers `{type:'cpu'}` with the process's CPU milliseconds, and exits on `{type:'stop'}`.
 */
import { loadEdge, type EngineChoice } from '../src/http/engine.js';
import { listen } from '../src/http/server.js';
import type { Route } from '../src/http/types.js';
import type { IngestSink } from '../src/validation-pool/index.js';

const engine = (process.argv[2] ?? 'node') as EngineChoice;
const edge = await loadEdge(engine);
if (edge.adapter.name !== engine) throw new Error(`edge-sink: asked for ${engine}, ${edge.reason}`);

const sink: Route = {
  method: 'POST',
  pattern: '/sink',
  body: 'streaming',
  handler: async (_req, body) => {
    let bytes = 0;
    const counter: IngestSink<void> = {
      write: (chunk) => {
        bytes += chunk.byteLength;
        return true;
      },
      onDrain: () => {},
      decided: false,
      end: async () => {},
      abort: () => {},
    };
    const complete = await body.pipe(counter);
    return { status: complete ? 200 : 400, body: { bytes } };
  },
};

const server = await listen({
  edge: edge.adapter,
  host: '127.0.0.1',
  port: 0,
  routes: [sink],
  limits: {
    ingestBodyBytes: 1024 * 1024 * 1024,
    otherBodyBytes: 1024 * 1024,
    requestTimeoutMs: 600_000,
    bodyRateWindowMs: 10_000,
    minBodyBytesPerSecond: 16_384,
    requestsPerSecond: 0,
    burst: 1,
    concurrentPerClient: 0,
    trackedClients: 1000,
  },
  onInternalError: (err) => process.stderr.write(`edge-sink: ${String(err)}\n`),
});

const cpuMs = () => {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000;
};
process.on('message', (m: { type: string }) => {
  if (m.type === 'cpu') process.send!({ type: 'cpu', ms: cpuMs() });
  if (m.type === 'stop') {
    server.close();
    process.disconnect();
    process.exit(0);
  }
});
process.send!({ type: 'ready', url: `http://127.0.0.1:${server.port}` });
