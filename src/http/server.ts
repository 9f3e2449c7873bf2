/**
 * The edge core: everything of HTTP that does not depend on the server library, so the two
 * adapters (`uws-edge.ts`, `node-edge.ts`) answer alike — head checks, routing, body limits,
 * per-client admission, timeouts, body back-pressure, error bodies and the access-log event.
 * Handlers never see an adapter's objects; the port's types are in `types.ts`.
 */
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { asServiceError, errors, isServiceError, ServiceError } from '../errors.js';
import type { IngestSink } from '../ingest/types.js';
import { addressAllowed, clientAddress } from './auth.js';
import { ClientLimiter, UNLIMITED, type ClientSlot } from './client-limiter.js';
import { checkHead } from './request-head.js';
import { isRatedPath, Router } from './router.js';
import type {
  BodyStream,
  BufferedHandler,
  Reply,
  Request,
  Server,
  ServerOptions,
  StreamingHandler,
  WireExchange,
  WireHandlers,
  WireHead,
  WireReply,
} from './types.js';

export type {
  BodyStream,
  BufferedHandler,
  EdgeName,
  Reply,
  Request,
  RequestContext,
  ResponseEvent,
  Route,
  Server,
  ServerLimits,
  ServerOptions,
  StreamingHandler,
} from './types.js';

const SANE_REQUEST_ID = /^[A-Za-z0-9._:/+=-]{1,128}$/;
const noResponseObserver = (): void => {};
/** How long a request timeout waits for a handler past its point of no return (`BodyStream.hold`): a recording's store write, retries included. */
export const HOLD_MS = 30_000;

export async function listen(opts: ServerOptions): Promise<Server> {
  const router = new Router(opts.routes, opts.limits);
  const limiter = new ClientLimiter(opts.limits, opts.limiterClock);
  const trusted = opts.trustedProxies ?? null;
  // limits.perIpAtProxy: what the proxy forwards it has counted per client already.
  const limitedHere = (peer: string): boolean => !(opts.limits.perIpAtProxy && trusted !== null && addressAllowed(trusted, peer));
  const observe = opts.onResponse ?? noResponseObserver;
  const inflight = new Inflight();

  const onRequest = (head: WireHead, wire: WireExchange): void => {
    const startedAt = performance.now();
    const method = head.method.toUpperCase();
    const checked = checkHead(head);
    const { headers, hasBody } = checked;
    let problem = checked.problem;
    let address = head.remoteAddress;
    if (!problem) {
      try {
        address = clientAddress(head.remoteAddress, headers.get('x-forwarded-for'), trusted);
      } catch (err) {
        problem = isServiceError(err) ? err : errors.invalidForwardedFor();
      }
    }
    const match = router.match(method, head.path);
    const incomingId = headers.get('x-request-id');
    const requestId = incomingId !== undefined && SANE_REQUEST_ID.test(incomingId) ? incomingId : randomUUID();
    const req: Request = {
      method,
      path: head.path,
      query: head.query,
      headers,
      remoteAddress: head.remoteAddress,
      clientAddress: address,
      params: match.params,
      requestId,
      context: {},
    };
    const pattern = match.route?.route.pattern ?? null;
    const answerNow = (err: ServiceError, closeConnection: boolean): void => {
      wire.respond(wireReply(replyFor(err), requestId), closeConnection || inflight.draining);
      observe({ req, route: pattern, status: err.statusCode, durationMs: performance.now() - startedAt });
    };

    // A head that could be read two ways, or that the service refuses whatever its route:
    // answered and the connection closed (what follows on it cannot be trusted).
    if (problem) {
      answerNow(problem, true);
      return;
    }
    // Check 1 of docs/api.md "Check order", answered before any body byte is read: body too large by
    // Content-Length, then the per-client limits. An unread body closes the connection.
    const limit = match.route?.bodyLimit ?? opts.limits.otherBodyBytes;
    if (checked.contentLength !== null && checked.contentLength > limit) {
      answerNow(errors.bodyTooLarge(limit), true);
      return;
    }
    const slot = limitedHere(head.remoteAddress) ? limiter.admit(address, isRatedPath(head.path)) : UNLIMITED;
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
      wire,
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
  };

  /** A head the adapter's parser refused: answered in the contract's shape, logged like any other. */
  const onRefused = (problem: ServiceError, remoteAddress: string): WireReply => {
    const requestId = randomUUID();
    const req: Request = { method: '-', path: '', query: '', headers: new Map(), remoteAddress, clientAddress: remoteAddress, params: {}, requestId, context: {} };
    observe({ req, route: null, status: problem.statusCode, durationMs: 0 });
    return wireReply(replyFor(problem), requestId);
  };
  const handlers: WireHandlers = { request: onRequest, refused: onRefused };

  // An address still taken (a previous process's connections in TIME_WAIT, where the library
  // binds without SO_REUSEADDR) is waited out for `listenRetryMs`.
  const deadline = Date.now() + (opts.port === 0 ? 0 : (opts.listenRetryMs ?? 0));
  let listener = await opts.edge.listen(opts.host, opts.port, handlers);
  if (!listener && Date.now() < deadline) opts.onListenRetry?.(deadline - Date.now());
  while (!listener && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 250));
    listener = await opts.edge.listen(opts.host, opts.port, handlers);
  }
  if (!listener) throw new Error(`Cannot listen on ${opts.host}:${opts.port}`);
  const bound = listener;
  return {
    port: bound.port,
    edge: opts.edge.name,
    close: () => bound.close(),
    drain: (graceMs) => {
      inflight.draining = true;
      bound.close();
      return inflight.drain(graceMs);
    },
  };
}

/** The exchanges not yet done (answered or aborted, and their handler settled), for `drain`. */
class Inflight {
  readonly #live = new Set<Exchange>();
  draining = false;
  #idle: (() => void) | undefined;

  add(e: Exchange): void {
    this.#live.add(e);
  }

  done(e: Exchange): void {
    this.#live.delete(e);
    if (this.#live.size === 0) this.#idle?.();
  }

  drain(graceMs: number): Promise<boolean> {
    this.draining = true;
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
 * One request/response pair: owns the wire exchange until it is answered or aborted, and the
 * client's in-flight slot until then.
 *
 * Timers: `requestTimeoutMs` runs from the headers to the response, whatever the handler is
 * doing. The body-rate window runs only while the edge waits for body bytes (not while it
 * paused the socket itself): each `bodyRateWindowMs` must bring `minBodyBytesPerSecond` ×
 * the window, or 408 and the connection is closed. The adapters keep their libraries' own
 * timers from cutting a body first (see each adapter).
 */
class Exchange {
  private finished = false;
  /** The handler passed its point of no return (`BodyStream.hold`). */
  private holding = false;
  private readonly abort = new AbortController();
  private timer: NodeJS.Timeout;
  private window: NodeJS.Timeout | undefined;
  private windowBytes = 0;
  private readonly windowNeeds: number;
  private slot: ClientSlot | undefined;
  private sink: IngestSink<unknown> | undefined;
  /** Settles `pipe`'s promise: true once the sink's `end()` settled, false when the body was abandoned first. */
  private piped: ((ended: boolean) => void) | undefined;
  private early: Uint8Array[] = [];
  private received = 0;
  private bodyDone = false;
  private discarding = false;
  private paused = false;
  private handlerRunning = false;
  private released = false;

  constructor(
    private readonly wire: WireExchange,
    private readonly opts: ServerOptions,
    readonly req: Request,
    private readonly hasBody: boolean,
    private readonly limiter: ClientLimiter,
    slot: ClientSlot,
    private readonly observed: (status: number | 'aborted') => void,
    private readonly inflight: Inflight,
  ) {
    inflight.add(this);
    wire.onAborted(() => {
      const answered = this.finished;
      this.finished = true;
      this.teardown(false);
      if (!answered) this.observed('aborted');
      this.release();
    });
    this.slot = slot;
    this.timer = setTimeout(() => this.timedOut(), opts.limits.requestTimeoutMs);
    this.timer.unref();
    this.windowNeeds = Math.max(1, (opts.limits.minBodyBytesPerSecond * opts.limits.bodyRateWindowMs) / 1000);
  }

  runBuffered(handler: BufferedHandler, limit: number): void {
    const chunks: Buffer[] = [];
    this.watchBody();
    this.wire.onData((chunk, isLast) => {
      if (this.finished) return;
      this.received += chunk.byteLength;
      if (this.received > limit) {
        this.fail(errors.bodyTooLarge(limit), true);
        return;
      }
      if (chunk.byteLength > 0) {
        chunks.push(copy(chunk));
        this.progress(chunk.byteLength);
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
    this.wire.pause();
    this.paused = true;
    this.wire.onData((chunk, isLast) => {
      if (this.finished && !this.discarding) return;
      this.received += chunk.byteLength;
      if (this.received > limit) {
        this.fail(errors.bodyTooLarge(limit), true);
        return;
      }
      this.progress(chunk.byteLength);
      if (isLast) {
        this.bodyDone = true;
        this.unwatchBody();
      }
      if (this.discarding) return;
      if (!this.sink) {
        if (chunk.byteLength > 0) this.early.push(copy(chunk));
        return;
      }
      if (chunk.byteLength > 0 && !this.sink.write(chunk)) this.pause();
      if (isLast) this.endBody(this.sink);
    });
    const body: BodyStream = {
      pipe: (sink) =>
        new Promise<boolean>((resolve) => {
          if (this.finished) {
            sink.abort();
            resolve(false);
            return;
          }
          this.sink = sink;
          this.piped = resolve;
          sink.onDrain(() => this.resume());
          const early = this.early;
          this.early = [];
          let full = false;
          for (const chunk of early) full = !sink.write(chunk) || full;
          if (this.bodyDone) this.endBody(sink);
          else if (!full) this.resume();
        }),
      discard: () => {
        this.discarding = true;
        this.early = [];
        this.resume();
      },
      hold: () => {
        if (this.finished) return false;
        this.holding = true;
        return true;
      },
    };
    this.settle(handler(this.req, body, this.abort.signal));
  }

  /** The body is complete: the sink's `end()`, whose outcome the handler reads from the sink itself. */
  private endBody(sink: IngestSink<unknown>): void {
    const piped = this.piped;
    const settled = () => piped?.(true);
    sink.end().then(settled, settled);
  }

  /**
   * Answers for the server (a timeout, a body over the limit) whatever the handler is doing,
   * and tells the handler through its signal that its own answer will never be sent: an
   * ingest must then not commit what its client was told failed.
   */
  /**
   * The request timeout: 408, unless the handler passed its point of no return (`hold`), whose
   * answer (a recorded package's 200) is then waited for a little longer, so that no client
   * is told 408 about a package that gets stored.
   */
  private timedOut(): void {
    if (this.holding && !this.finished) {
      this.holding = false;
      this.timer = setTimeout(() => this.timedOut(), HOLD_MS);
      this.timer.unref();
      return;
    }
    this.fail(errors.requestTimeout(), true);
  }

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
        const failure = asServiceError(err);
        // Handlers wrap unexpected failures (a worker crash, a store error) as INTERNAL
        // ServiceErrors: those are logged too, with what caused them.
        if (failure.code === 'INTERNAL') this.opts.onInternalError(failure === err ? (failure.cause ?? failure) : err, this.req);
        else if (failure.code === 'STORAGE_UNAVAILABLE') this.opts.onStorageUnavailable?.(failure.cause ?? failure, this.req);
        this.send(replyFor(failure), !this.bodyDone);
      },
    );
  }

  private send(reply: Reply, closeConnection: boolean): void {
    if (this.finished) return;
    const wire = this.serialised(reply);
    this.finished = true;
    this.paused = false;
    this.wire.respond(wire, closeConnection || this.inflight.draining);
    this.teardown(true);
    this.observed(reply.status);
    this.release();
  }

  /**
   * The reply ready for the wire. A body `JSON.stringify` cannot write (an echoed client value
   * nested deeper than its stack allows) would throw past every handler and end the process:
   * it answers 500 instead.
   */
  private serialised(reply: Reply): WireReply {
    try {
      return wireReply(reply, this.req.requestId);
    } catch (err) {
      this.opts.onInternalError(err, this.req);
      return wireReply(replyFor(errors.internal(err)), this.req.requestId);
    }
  }

  /** The end of a graceful stop's patience: closes the connection (`onAborted` runs). */
  cut(): void {
    if (!this.finished) this.wire.destroy();
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
      // The client left, or the body was not read to its end: the sink drops what it holds and runs.
      this.sink?.abort();
      this.piped?.(false);
      this.sink = undefined;
      this.piped = undefined;
    }
    this.early = [];
  }

  /** Starts a body-rate window: the edge now waits for body bytes. */
  private watchBody(): void {
    if (!this.hasBody || this.bodyDone || this.finished || this.window) return;
    this.windowBytes = 0;
    this.window = setTimeout(() => this.windowEnded(), this.opts.limits.bodyRateWindowMs);
    this.window.unref();
  }

  private windowEnded(): void {
    if (this.windowBytes < this.windowNeeds) {
      this.window = undefined;
      this.fail(errors.requestTimeout(), true);
      return;
    }
    this.windowBytes = 0;
    this.window?.refresh();
  }

  private unwatchBody(): void {
    if (this.window) {
      clearTimeout(this.window);
      this.window = undefined;
    }
  }

  private progress(bytes: number): void {
    this.windowBytes += bytes;
  }

  private pause(): void {
    if (!this.paused && !this.finished) {
      this.paused = true;
      this.unwatchBody();
      this.wire.pause();
    }
  }

  private resume(): void {
    if (this.paused && !this.finished) {
      this.paused = false;
      this.wire.resume();
      this.watchBody();
    }
  }
}

function wireReply(reply: Reply, requestId: string): WireReply {
  const body = reply.raw !== undefined ? (reply.body as string | Uint8Array) : JSON.stringify(reply.body ?? null);
  const headers: [string, string][] = [
    ['Content-Type', reply.raw?.contentType ?? 'application/json'],
    ['X-Request-Id', requestId],
  ];
  for (const [k, v] of Object.entries(reply.headers ?? {})) headers.push([k, v]);
  return { status: reply.status, headers, body };
}

function replyFor(err: ServiceError): Reply {
  return { status: err.statusCode, body: err.body, headers: { ...err.headers } };
}

function copy(chunk: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(chunk.byteLength);
  out.set(chunk);
  return out;
}
