/**
 * The HTTP edge on uWebSockets.js: routing, body limits, timeouts, and turning handler
 * results and thrown errors into responses. Handlers never see uWS objects.
 *
 * uWS lifetimes (uWS index.d.ts, ultimate-express): `onAborted` is attached first, every
 * header is read synchronously in the route callback, chunks are copied before they are
 * kept, and every write after an await happens inside `cork`.
 */
import { randomUUID } from 'node:crypto';
import type { BlockList } from 'node:net';
import { performance } from 'node:perf_hooks';
import uWS from 'uWebSockets.js';
import { errors, isServiceError, ServiceError } from '../errors.js';
import { clientAddress } from './auth.js';
import { ClientLimiter, type ClientLimits, type ClientSlot } from './client-limiter.js';

export interface Request {
  readonly method: string;
  readonly path: string;
  readonly query: string;
  /** Lower-cased header names. */
  readonly headers: ReadonlyMap<string, string>;
  /** The peer address as seen on the socket. */
  readonly remoteAddress: string;
  /** The client's address after the trusted-proxy rule of `clientAddress` (what the per-client limits count). */
  readonly clientAddress: string;
  readonly params: Readonly<Record<string, string>>;
  readonly id: number;
  /**
   * The request id: the client's `X-Request-Id` when it is sane (1 to 128 of
   * `[A-Za-z0-9._:/+=-]`), else a fresh UUID. Echoed as the `X-Request-Id` response header.
   */
  readonly requestId: string;
  /** What handlers learn about the request for the access log (the authenticated client). */
  readonly context: RequestContext;
}

export interface RequestContext {
  clientId?: string;
}

/** One answered (or abandoned) request, reported once, after its response was written. */
export interface ResponseEvent {
  readonly req: Request;
  /** The matched route's pattern (never the raw path); null when no route matched. */
  readonly route: string | null;
  /** The status sent; 'aborted' when the client went away before the response. */
  readonly status: number | 'aborted';
  /** From the headers to the response. */
  readonly durationMs: number;
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

export interface ServerLimits extends ClientLimits {
  /** Body limit of streaming (ingest) routes (413). */
  ingestBodyBytes: number;
  /** Body limit of every other request (413). */
  otherBodyBytes: number;
  /** A request not answered by then: 408, connection closed. */
  requestTimeoutMs: number;
  /**
   * While the server waits for body bytes (not while it paused the socket itself), the body
   * must advance `idleProgressBytes` or end within every `idleTimeoutMs`; else 408 and the
   * connection is closed. A trickle of a byte a second is no progress (slow-loris).
   */
  idleTimeoutMs: number;
  idleProgressBytes: number;
}

export interface ServerOptions {
  host: string;
  port: number;
  routes: Route[];
  limits: ServerLimits;
  /** Peers whose `X-Forwarded-For` is believed when naming the client the per-client limits count. */
  trustedProxies?: BlockList | null;
  /** How long to keep retrying a fixed port that is still taken (0: fail at once). */
  listenRetryMs?: number;
  /** Told once, when the first bind failed and the retries begin (with how long they may take). */
  onListenRetry?: (retryMs: number) => void;
  /** Called with errors that become 500s; never with client errors. */
  onInternalError: (err: unknown, req: Request) => void;
  /** Called once per request when it is answered or aborted (metrics, access log). */
  onResponse?: (event: ResponseEvent) => void;
}

export interface Server {
  readonly port: number;
  /** Closes the listen socket; requests in flight go on against whatever they use. */
  close(): void;
  /**
   * A graceful stop: closes the listen socket (new connections are refused), lets every request
   * in flight finish, its handler included, and answers each with `Connection: close`; a
   * request that arrives meanwhile on an open keep-alive connection is served the same way (this
   * uWS build cannot close idle connections). Resolves true once none is left; at `graceMs`,
   * closes the connections of those still running (their handlers see the abort) and resolves
   * false.
   */
  drain(graceMs: number): Promise<boolean>;
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

/** Requests under this prefix take a token of the per-client rate limit (docs/api.md, Limits). */
const RATED_PREFIX = '/api/v1/';

const SANE_REQUEST_ID = /^[A-Za-z0-9._:/+=-]{1,128}$/;
const noResponseObserver = (): void => {};

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
  const limiter = new ClientLimiter(opts.limits);
  const trusted = opts.trustedProxies ?? null;
  let nextId = 1;
  const observe = opts.onResponse ?? noResponseObserver;
  const inflight = new Inflight();
  const app = uWS.App();

  app.any('/*', (res, uwsReq) => {
    const startedAt = performance.now();
    const method = uwsReq.getCaseSensitiveMethod().toUpperCase();
    const url = uwsReq.getUrl();
    const query = uwsReq.getQuery() ?? '';
    const headers = new Map<string, string>();
    uwsReq.forEach((k, v) => headers.set(k, v));
    const remoteAddress = normaliseAddress(Buffer.from(res.getRemoteAddressAsText()).toString());
    const address = clientAddress(remoteAddress, headers.get('x-forwarded-for'), trusted);

    const match = matchRoute(compiled, method, url);
    const incomingId = headers.get('x-request-id');
    const requestId = incomingId !== undefined && SANE_REQUEST_ID.test(incomingId) ? incomingId : randomUUID();
    const req: Request = {
      method,
      path: url,
      query,
      headers,
      remoteAddress,
      clientAddress: address,
      params: match.params,
      id: nextId++,
      requestId,
      context: {},
    };
    const pattern = match.route?.route.pattern ?? null;
    const answerNow = (err: ServiceError, closeConnection: boolean): void => {
      respondNow(res, err, closeConnection || inflight.draining, requestId);
      observe({ req, route: pattern, status: err.statusCode, durationMs: performance.now() - startedAt });
    };

    // Check 1 of docs/api.md (Check order), answered inside this callback (no Exchange, no timers): body too
    // large by Content-Length, then the per-client limits. An unread body closes the connection.
    const limit = match.route?.bodyLimit ?? opts.limits.otherBodyBytes;
    const declared = headers.get('content-length');
    if (declared !== undefined && (!/^\d+$/.test(declared) || Number(declared) > limit)) {
      answerNow(/^\d+$/.test(declared) ? errors.bodyTooLarge() : errors.invalidContentLength(), true);
      return;
    }
    const hasBody = declared !== undefined ? Number(declared) > 0 : headers.has('transfer-encoding');
    const slot = limiter.admit(address, url.startsWith(RATED_PREFIX));
    if (typeof slot === 'number') {
      answerNow(errors.rateLimited(slot), hasBody);
      return;
    }
    if (!match.route) {
      limiter.release(slot);
      answerNow(match.methodMismatch ? errors.methodNotAllowed() : errors.routeNotFound(), hasBody);
      return;
    }
    const exchange = new Exchange(
      res,
      opts,
      req,
      hasBody,
      limiter,
      slot,
      (status) => observe({ req, route: pattern, status, durationMs: performance.now() - startedAt }),
      inflight,
    );
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
  if (!socket && Date.now() < deadline) opts.onListenRetry?.(deadline - Date.now());
  while (!socket && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 250));
    socket = await bind();
  }
  if (!socket) throw new Error(`Cannot listen on ${opts.host}:${opts.port}`);
  const listenSocket = socket;
  let listening = true;
  const close = (): void => {
    // Closing a listen socket twice is a use after free in uSockets.
    if (listening) uWS.us_listen_socket_close(listenSocket);
    listening = false;
  };
  return {
    port: uWS.us_socket_local_port(listenSocket),
    close,
    drain: (graceMs) => {
      close();
      return inflight.drain(graceMs);
    },
  };
}

/** The exchanges not yet done (answered or aborted, and their handler settled), for `drain`. */
class Inflight {
  readonly #live = new Set<Exchange>();
  #draining = false;
  #idle: (() => void) | undefined;

  get draining(): boolean {
    return this.#draining;
  }

  add(e: Exchange): void {
    this.#live.add(e);
  }

  done(e: Exchange): void {
    this.#live.delete(e);
    if (this.#live.size === 0) this.#idle?.();
  }

  drain(graceMs: number): Promise<boolean> {
    this.#draining = true;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#idle = undefined;
        for (const e of [...this.#live]) e.cut();
        resolve(false);
      }, graceMs);
      this.#idle = () => {
        clearTimeout(timer);
        this.#idle = undefined;
        resolve(true);
      };
      if (this.#live.size === 0) this.#idle();
    });
  }
}

/**
 * One request/response pair: owns the uWS response until it is ended or aborted, and the
 * client's in-flight slot until then.
 *
 * Timers: `requestTimeoutMs` runs from the headers to the response, whatever the handler is
 * doing. The idle timer runs only while the server waits for body bytes. uWS's own timers
 * (this build: 10 s, checked every 4 s) close a socket whose headers do not complete, and one
 * whose unpaused body delivers less than 160 KiB per 10 s, without a response; a paused
 * socket has no uWS timer (see `runStreaming`).
 */
class Exchange {
  private finished = false;
  private readonly abort = new AbortController();
  private readonly timer: NodeJS.Timeout;
  private idle: NodeJS.Timeout | undefined;
  private idleBytes = 0;
  private slot: ClientSlot | undefined;
  private sink: BodySink | undefined;
  private early: Uint8Array[] = [];
  private received = 0;
  private bodyDone = false;
  private discarding = false;
  private paused = false;
  private handlerRunning = false;
  private released = false;

  constructor(
    private readonly res: uWS.HttpResponse,
    private readonly opts: ServerOptions,
    readonly req: Request,
    private readonly hasBody: boolean,
    private readonly limiter: ClientLimiter,
    slot: ClientSlot,
    private readonly observed: (status: number | 'aborted') => void,
    private readonly inflight: Inflight,
  ) {
    inflight.add(this);
    res.onAborted(() => {
      const answered = this.finished;
      this.finished = true;
      this.teardown(false);
      if (!answered) this.observed('aborted');
      this.release();
    });
    this.slot = slot;
    this.timer = setTimeout(() => this.fail(errors.requestTimeout(), true), opts.limits.requestTimeoutMs);
    this.timer.unref();
  }

  runBuffered(handler: BufferedHandler, limit: number): void {
    const chunks: Buffer[] = [];
    this.watchBody();
    this.res.onData((ab, isLast) => {
      if (this.finished) return;
      this.received += ab.byteLength;
      if (this.received > limit) {
        this.fail(errors.bodyTooLarge(), true);
        return;
      }
      if (ab.byteLength > 0) {
        chunks.push(copy(ab));
        this.progress(ab.byteLength);
      }
      if (isLast) {
        this.bodyDone = true;
        this.unwatchBody();
        this.settle(handler(this.req, chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
      }
    });
  }

  runStreaming(handler: StreamingHandler, limit: number): void {
    // Nothing is read until the handler has done its checks and asks for the body.
    this.res.pause();
    this.paused = true;
    // uWS arms its 10 s body timer when this callback returns, paused or not, and would close
    // a request whose checks take longer. A pause from outside the callback disarms it; the
    // request timeout still covers the wait.
    setImmediate(() => {
      if (this.paused && !this.finished) this.res.pause();
    });
    this.res.onData((ab, isLast) => {
      if (this.finished && !this.discarding) return;
      this.received += ab.byteLength;
      if (this.received > limit) {
        this.fail(errors.bodyTooLarge(), true);
        return;
      }
      this.progress(ab.byteLength);
      if (isLast) {
        this.bodyDone = true;
        this.unwatchBody();
      }
      if (this.discarding) return;
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
    this.settle(handler(this.req, body, this.abort.signal));
  }

  /**
   * Answers for the server (a timeout, a body over the limit) whatever the handler is doing,
   * and tells the handler through its signal that its own answer will never be sent: an
   * ingest must then not commit what its client was told failed.
   */
  fail(err: ServiceError, closeConnection: boolean): void {
    this.send(replyFor(err), closeConnection);
    this.abort.abort();
  }

  private settle(handled: Promise<Reply>): void {
    this.handlerRunning = true;
    const pending = handled.finally(() => {
      this.handlerRunning = false;
      this.release();
    });
    pending.then(
      (reply) => this.send(reply, !this.bodyDone),
      (err: unknown) => {
        // Already answered or aborted: the failure is the consequence (the client went away,
        // a limit cut the body), and nobody is there to tell.
        if (this.finished) return;
        const failure = isServiceError(err) ? err : errors.internal(err);
        // Handlers wrap unexpected failures (a worker crash, a store error) as INTERNAL
        // ServiceErrors: those are logged too, with what caused them.
        if (failure.code === 'INTERNAL') this.opts.onInternalError(failure === err ? (failure.cause ?? failure) : err, this.req);
        this.send(replyFor(failure), !this.bodyDone);
      },
    );
  }

  private send(reply: Reply, closeConnection: boolean): void {
    if (this.finished) return;
    reply = this.serialised(reply);
    this.finished = true;
    this.res.cork(() => {
      // A paused socket stays paused after the response; the next request on it would hang.
      if (this.paused) {
        this.paused = false;
        this.res.resume();
      }
      writeReply(this.res, reply, closeConnection || this.inflight.draining, this.req.requestId);
    });
    this.teardown(true);
    this.observed(reply.status);
    this.release();
  }

  /**
   * The reply with its JSON body already written out. A body `JSON.stringify` cannot write
   * (an echoed client value nested deeper than its stack allows) would throw inside `cork`,
   * past every handler, and end the process: it answers 500 instead.
   */
  private serialised(reply: Reply): Reply {
    if (reply.raw !== undefined) return reply;
    const json = { contentType: 'application/json' };
    try {
      return { ...reply, body: JSON.stringify(reply.body ?? null), raw: json };
    } catch (err) {
      this.opts.onInternalError(err, this.req);
      const failure = replyFor(errors.internal(err));
      return { ...failure, body: JSON.stringify(failure.body), raw: json };
    }
  }

  /** The end of a graceful stop's patience: closes the connection (`onAborted` runs). */
  cut(): void {
    if (!this.finished) this.res.close();
  }

  /** Done for `drain` once answered (or aborted) and the handler has settled. */
  private release(): void {
    if (this.released || !this.finished || this.handlerRunning) return;
    this.released = true;
    this.inflight.done(this);
  }

  private teardown(responded: boolean): void {
    clearTimeout(this.timer);
    this.unwatchBody();
    if (this.slot) {
      this.limiter.release(this.slot);
      this.slot = undefined;
    }
    if (!responded || !this.bodyDone) {
      this.abort.abort();
      this.sink?.finish(false);
      this.sink = undefined;
    }
    this.early = [];
  }

  /** Starts the idle timer: the server now waits for body bytes. */
  private watchBody(): void {
    if (!this.hasBody || this.bodyDone || this.finished || this.idle) return;
    this.idleBytes = 0;
    this.idle = setTimeout(() => this.fail(errors.requestTimeout(), true), this.opts.limits.idleTimeoutMs);
    this.idle.unref();
  }

  private unwatchBody(): void {
    if (this.idle) {
      clearTimeout(this.idle);
      this.idle = undefined;
    }
  }

  /** Counts body bytes; every `idleProgressBytes` of them re-arm the idle timer. */
  private progress(bytes: number): void {
    if (!this.idle) return;
    this.idleBytes += bytes;
    if (this.idleBytes >= this.opts.limits.idleProgressBytes) {
      this.idleBytes = 0;
      this.idle.refresh();
    }
  }

  private pause(): void {
    if (!this.paused && !this.finished) {
      this.paused = true;
      this.unwatchBody();
      this.res.pause();
    }
  }

  private resume(): void {
    if (this.paused && !this.finished) {
      this.paused = false;
      this.res.resume();
      this.watchBody();
    }
  }
}

/** Answers inside the route callback, where uWS has corked the socket already. */
function respondNow(res: uWS.HttpResponse, err: ServiceError, closeConnection: boolean, requestId: string): void {
  writeReply(res, replyFor(err), closeConnection, requestId);
}

function writeReply(res: uWS.HttpResponse, reply: Reply, closeConnection: boolean, requestId: string): void {
  const body = reply.raw !== undefined ? (reply.body as string | Uint8Array) : JSON.stringify(reply.body ?? null);
  res.writeStatus(`${reply.status} ${STATUS_TEXT[reply.status] ?? ''}`.trimEnd());
  res.writeHeader('Content-Type', reply.raw?.contentType ?? 'application/json');
  res.writeHeader('X-Request-Id', requestId);
  for (const [k, v] of Object.entries(reply.headers ?? {})) res.writeHeader(k, v);
  res.end(body, closeConnection);
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
