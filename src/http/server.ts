/**
 * The HTTP edge on uWebSockets.js: routing, body limits, timeouts, and turning handler
 * results and thrown errors into responses. Handlers never see uWS objects.
 *
 * uWS lifetimes (uWS index.d.ts, ultimate-express): `onAborted` is attached first, every
 * header is read synchronously in the route callback, chunks are copied before they are
 * kept, and every write after an await happens inside `cork`.
 */
import uWS from 'uWebSockets.js';
import { errors, isServiceError, ServiceError } from '../errors.js';

export interface Request {
  readonly method: string;
  readonly path: string;
  readonly query: string;
  /** Lower-cased header names. */
  readonly headers: ReadonlyMap<string, string>;
  /** The peer address as seen on the socket. */
  readonly remoteAddress: string;
  readonly params: Readonly<Record<string, string>>;
  readonly id: number;
}

export interface Reply {
  status: number;
  body: unknown;
  headers?: Record<string, string>;
  /** Default: JSON-serialise `body`. `raw` sends a string or bytes as given. */
  raw?: { contentType: string };
}

/** Where a streaming route sends body chunks. The server pauses the socket while `write` returns false. */
export interface BodySink {
  write(chunk: Uint8Array): boolean;
  onDrain(cb: () => void): void;
  /** The body ended (true) or will never end: the client went away, or a limit was hit (false). */
  finish(complete: boolean): void;
}

export interface BodyStream {
  /** Starts delivering the body (chunks that arrived earlier first). Call once. */
  pipe(sink: BodySink): void;
  /** Discards the body; the connection is closed after the response. */
  discard(): void;
}

export type BufferedHandler = (req: Request, body: Buffer) => Promise<Reply>;
export type StreamingHandler = (req: Request, body: BodyStream, signal: AbortSignal) => Promise<Reply>;

export type Route =
  | { method: string; pattern: string; body: 'buffered'; handler: BufferedHandler }
  | { method: string; pattern: string; body: 'streaming'; handler: StreamingHandler };

export interface ServerOptions {
  host: string;
  port: number;
  routes: Route[];
  limits: { ingestBodyBytes: number; otherBodyBytes: number; requestTimeoutMs: number };
  /** How long to keep retrying a fixed port that is still taken (0: fail at once). */
  listenRetryMs?: number;
  /** Called with errors that become 500s; never with client errors. */
  onInternalError: (err: unknown, req: Request) => void;
}

export interface Server {
  readonly port: number;
  close(): void;
}

interface CompiledRoute {
  method: string;
  segments: string[];
  route: Route;
  bodyLimit: number;
}

const STATUS_TEXT: Record<number, string> = {
  200: 'OK', 400: 'Bad Request', 401: 'Unauthorized', 403: 'Forbidden', 404: 'Not Found',
  405: 'Method Not Allowed', 408: 'Request Timeout', 409: 'Conflict', 413: 'Payload Too Large',
  415: 'Unsupported Media Type', 422: 'Unprocessable Entity', 500: 'Internal Server Error',
  502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout',
};

/** True when the native uWS binary loaded (the package silently falls back to a slow JS server). */
export function uwsIsNative(): boolean {
  return Function.prototype.toString.call(uWS.App).includes('[native code]');
}

export async function listen(opts: ServerOptions): Promise<Server> {
  const compiled: CompiledRoute[] = opts.routes.map((route) => ({
    method: route.method,
    segments: route.pattern.split('/').filter(Boolean),
    route,
    bodyLimit: route.body === 'streaming' ? opts.limits.ingestBodyBytes : opts.limits.otherBodyBytes,
  }));
  let nextId = 1;
  const app = uWS.App();

  app.any('/*', (res, uwsReq) => {
    const exchange = new Exchange(res, opts);
    const method = uwsReq.getCaseSensitiveMethod().toUpperCase();
    const url = uwsReq.getUrl();
    const query = uwsReq.getQuery() ?? '';
    const headers = new Map<string, string>();
    uwsReq.forEach((k, v) => headers.set(k, v));
    const remoteAddress = normaliseAddress(Buffer.from(res.getRemoteAddressAsText()).toString());

    const match = matchRoute(compiled, method, url);
    const req: Request = { method, path: url, query, headers, remoteAddress, params: match.params, id: nextId++ };
    exchange.req = req;

    const limit = match.route?.bodyLimit ?? opts.limits.otherBodyBytes;
    const declared = headers.get('content-length');
    if (declared !== undefined && (!/^\d+$/.test(declared) || Number(declared) > limit)) {
      exchange.fail(declared !== undefined && /^\d+$/.test(declared) ? errors.bodyTooLarge() : errors.invalidContentLength(), true);
      return;
    }
    if (!match.route) {
      exchange.fail(match.methodMismatch ? errors.methodNotAllowed() : errors.routeNotFound(), true);
      return;
    }
    const route = match.route.route;
    if (route.body === 'buffered') exchange.runBuffered(route.handler, limit);
    else exchange.runStreaming(route.handler, limit);
  });

  const bind = () =>
    new Promise<uWS.us_listen_socket | false>((resolve) => app.listen(opts.host, opts.port, (socket) => resolve(socket)));
  // This uWS build binds without SO_REUSEADDR: after a restart the port stays taken while the
  // previous process's closed connections sit in TIME_WAIT (up to 60 s on Linux). Wait it out.
  const deadline = Date.now() + (opts.port === 0 ? 0 : (opts.listenRetryMs ?? 0));
  let socket = await bind();
  while (!socket && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 250));
    socket = await bind();
  }
  if (!socket) throw new Error(`Cannot listen on ${opts.host}:${opts.port}`);
  const listenSocket = socket;
  return {
    port: uWS.us_socket_local_port(listenSocket),
    close: () => uWS.us_listen_socket_close(listenSocket),
  };
}

/** One request/response pair: owns the uWS response until it is ended or aborted. */
class Exchange {
  req: Request | undefined;
  private finished = false;
  private readonly abort = new AbortController();
  private readonly timer: NodeJS.Timeout;
  private sink: BodySink | undefined;
  private early: Uint8Array[] = [];
  private received = 0;
  private bodyDone = false;
  private discarding = false;
  private paused = false;

  constructor(
    private readonly res: uWS.HttpResponse,
    private readonly opts: ServerOptions,
  ) {
    res.onAborted(() => {
      this.finished = true;
      this.teardown(false);
    });
    this.timer = setTimeout(() => this.fail(errors.requestTimeout(), true), opts.limits.requestTimeoutMs);
    this.timer.unref();
  }

  runBuffered(handler: BufferedHandler, limit: number): void {
    const chunks: Buffer[] = [];
    this.res.onData((ab, isLast) => {
      if (this.finished) return;
      this.received += ab.byteLength;
      if (this.received > limit) {
        this.fail(errors.bodyTooLarge(), true);
        return;
      }
      if (ab.byteLength > 0) chunks.push(copy(ab));
      if (isLast) {
        this.bodyDone = true;
        this.settle(handler(this.req!, chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
      }
    });
  }

  runStreaming(handler: StreamingHandler, limit: number): void {
    // Nothing is read until the handler has done its checks and asks for the body.
    this.res.pause();
    this.paused = true;
    this.res.onData((ab, isLast) => {
      if (this.finished && !this.discarding) return;
      this.received += ab.byteLength;
      if (this.received > limit) {
        this.fail(errors.bodyTooLarge(), true);
        return;
      }
      if (this.discarding) return;
      if (isLast) this.bodyDone = true;
      if (!this.sink) {
        if (ab.byteLength > 0) this.early.push(copy(ab));
        return;
      }
      if (ab.byteLength > 0 && !this.sink.write(new Uint8Array(ab))) this.pause();
      if (isLast) this.sink.finish(true);
    });
    const body: BodyStream = {
      pipe: (sink) => {
        if (this.finished) {
          sink.finish(false);
          return;
        }
        this.sink = sink;
        sink.onDrain(() => this.resume());
        const early = this.early;
        this.early = [];
        let full = false;
        for (const chunk of early) full = !sink.write(chunk) || full;
        if (this.bodyDone) sink.finish(true);
        else if (!full) this.resume();
      },
      discard: () => {
        this.discarding = true;
        this.early = [];
        this.resume();
      },
    };
    this.settle(handler(this.req!, body, this.abort.signal));
  }

  fail(err: ServiceError, closeConnection: boolean): void {
    this.send(replyFor(err), closeConnection);
  }

  private settle(pending: Promise<Reply>): void {
    pending.then(
      (reply) => this.send(reply, !this.bodyDone),
      (err: unknown) => {
        if (!isServiceError(err)) this.opts.onInternalError(err, this.req!);
        this.send(replyFor(isServiceError(err) ? err : errors.internal(err)), !this.bodyDone);
      },
    );
  }

  private send(reply: Reply, closeConnection: boolean): void {
    if (this.finished) return;
    this.finished = true;
    const body =
      reply.raw !== undefined ? (reply.body as string | Uint8Array) : JSON.stringify(reply.body ?? null);
    const contentType = reply.raw?.contentType ?? 'application/json';
    this.res.cork(() => {
      // A paused socket stays paused after the response; the next request on it would hang.
      if (this.paused) {
        this.paused = false;
        this.res.resume();
      }
      this.res.writeStatus(`${reply.status} ${STATUS_TEXT[reply.status] ?? ''}`.trimEnd());
      this.res.writeHeader('Content-Type', contentType);
      for (const [k, v] of Object.entries(reply.headers ?? {})) this.res.writeHeader(k, v);
      this.res.end(body, closeConnection);
    });
    this.teardown(true);
  }

  private teardown(responded: boolean): void {
    clearTimeout(this.timer);
    if (!responded || !this.bodyDone) {
      this.abort.abort();
      this.sink?.finish(false);
      this.sink = undefined;
    }
    this.early = [];
  }

  private pause(): void {
    if (!this.paused && !this.finished) {
      this.paused = true;
      this.res.pause();
    }
  }

  private resume(): void {
    if (this.paused && !this.finished) {
      this.paused = false;
      this.res.resume();
    }
  }
}

function replyFor(err: ServiceError): Reply {
  return { status: err.statusCode, body: err.body, headers: { ...err.headers } };
}

function copy(ab: ArrayBuffer): Buffer {
  const out = Buffer.allocUnsafe(ab.byteLength);
  out.set(new Uint8Array(ab));
  return out;
}

function matchRoute(
  routes: CompiledRoute[],
  method: string,
  url: string,
): { route?: CompiledRoute; params: Record<string, string>; methodMismatch: boolean } {
  const parts = url.split('/').filter(Boolean);
  let methodMismatch = false;
  for (const candidate of routes) {
    const params = matchSegments(candidate.segments, parts);
    if (!params) continue;
    if (candidate.method === method) return { route: candidate, params, methodMismatch: false };
    methodMismatch = true;
  }
  return { params: {}, methodMismatch };
}

function matchSegments(pattern: string[], parts: string[]): Record<string, string> | null {
  if (pattern.length !== parts.length) return null;
  const params: Record<string, string> = {};
  for (let i = 0; i < pattern.length; i++) {
    const p = pattern[i]!;
    const part = parts[i]!;
    if (p.startsWith(':')) {
      let value: string;
      try {
        value = decodeURIComponent(part);
      } catch {
        return null;
      }
      params[p.slice(1)] = value;
    } else if (p !== part) {
      return null;
    }
  }
  return params;
}

/** uWS gives IPv6-mapped IPv4 as `0000:...:ffff:7f00:0001` or `::ffff:a.b.c.d`; answer plain IPv4 for those. */
export function normaliseAddress(text: string): string {
  const mapped = /^(?:0{1,4}:){5}ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/i.exec(text);
  if (mapped) {
    const hi = parseInt(mapped[1]!, 16);
    const lo = parseInt(mapped[2]!, 16);
    return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
  }
  const dotted = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(text);
  return dotted ? dotted[1]! : text;
}
