/**
 * The node:http scaffolding the two HTTP peers share, so that they differ only in how
 * they parse and validate: the same routes as the service (`POST …/{uuid}/{entity}`,
 * `GET …/{uuid}/status` answering a constant body), the same limits (32 MiB on the wire,
 * 256 MiB decompressed, 413 past either), gzip bodies inflated as a stream, the same 200
 * body, and the probe. Peers do no authentication, session bookkeeping or storage.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pipeline, Transform, type Readable, type TransformCallback } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { findEntity, type EntitySpec } from '../../src/entities/catalog.js';
import { send, serveProbe, startProbe } from '../probe.js';

const API = '/api/v1/uploading/';
const WIRE_LIMIT = 32 * 1024 * 1024;
const INFLATED_LIMIT = 256 * 1024 * 1024;
const REQUEST_TIMEOUT_MS = 600_000;

export interface PeerReply {
  status: number;
  body: unknown;
}

/** Parses and validates one ingest body; `body` yields the (inflated) bytes. */
export type IngestHandler = (entity: EntitySpec, body: Readable) => Promise<PeerReply>;

/** `message` is the limit met, as the service's 413 names it (`32 MiB`, `256 MiB once inflated`). */
export class BodyTooLarge extends Error {
  override readonly name = 'BodyTooLarge';
  readonly code = 'BODY_TOO_LARGE';
}

export const success = (entity: EntitySpec, rows: number): PeerReply => ({
  status: 200,
  body: { status: 'success', message: `${rows} rows of ${entity.name} validated and queued for storage`, rows_processed: rows },
});

/** A corrupt gzip stream: answered like a body that is not JSON. */
export function isZlibError(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && code.startsWith('Z_');
}

export const unprocessable = (detail: unknown): PeerReply => ({ status: 422, body: { detail } });

export function startPeer(handle: IngestHandler): void {
  const probe = startProbe();
  const server = createServer({ requestTimeout: REQUEST_TIMEOUT_MS }, (req, res) => {
    route(req, res, handle).catch((err: unknown) => {
      console.error('bench peer: request failed', err);
      reply(res, { status: 500, body: { detail: 'Internal Server Error' } }, true);
    });
  });
  server.listen(0, '127.0.0.1', () => {
    const { port } = server.address() as AddressInfo;
    serveProbe(probe, async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    });
    send({ type: 'ready', url: `http://127.0.0.1:${port}` });
  });
}

async function route(req: IncomingMessage, res: ServerResponse, handle: IngestHandler): Promise<void> {
  const path = (req.url ?? '').split('?')[0]!;
  const parts = path.startsWith(API) ? path.slice(API.length).split('/') : [];
  if (parts.length !== 2) return reply(res, { status: 404, body: { detail: 'Not Found' } }, false);
  const [uuid, last] = parts as [string, string];
  if (req.method === 'GET' && last === 'status') {
    return reply(res, { status: 200, body: { upload_uuid: uuid, session_status: 'UPLOADING', upload_tasks_finished: true } }, false);
  }
  if (req.method !== 'POST') return reply(res, { status: 405, body: { detail: 'Method Not Allowed' } }, false);
  const entity = findEntity(last);
  if (!entity) return reply(res, { status: 400, body: { detail: `Unknown entity: ${last}` } }, true);
  if (Number(req.headers['content-length'] ?? 0) > WIRE_LIMIT) {
    return reply(res, { status: 413, body: { detail: 'Request body too large (limit 32 MiB)' } }, true);
  }
  const gzip = /^\s*gzip\s*$/i.test(req.headers['content-encoding'] ?? '');
  // pipeline, not pipe: an aborted request or a bad gzip stream must reach the handler as an error.
  const ignore = () => {};
  const body: Readable = gzip
    ? pipeline(req, new ByteLimit(WIRE_LIMIT), createGunzip(), new ByteLimit(INFLATED_LIMIT, ' once inflated'), ignore)
    : pipeline(req, new ByteLimit(WIRE_LIMIT), ignore);
  let answer: PeerReply;
  try {
    answer = await handle(entity, body);
  } catch (err) {
    if (!(err instanceof BodyTooLarge)) throw err;
    answer = { status: 413, body: { detail: `Request body too large (limit ${err.message})` } };
  }
  // The body may be unread after an early answer: close instead of draining it.
  reply(res, answer, !req.readableEnded);
}

function reply(res: ServerResponse, answer: PeerReply, close: boolean): void {
  const text = JSON.stringify(answer.body);
  res.writeHead(answer.status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    ...(close ? { connection: 'close' } : {}),
  });
  res.end(text);
}

/** Passes bytes through and fails with BodyTooLarge past `limit`. */
class ByteLimit extends Transform {
  #seen = 0;
  constructor(
    private readonly limit: number,
    private readonly what = '',
  ) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.#seen += chunk.byteLength;
    if (this.#seen > this.limit) cb(new BodyTooLarge(`${this.limit / (1024 * 1024)} MiB${this.what}`));
    else cb(null, chunk);
  }
}
