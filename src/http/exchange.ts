/**
 * One request/response pair on the edge (`Exchange`), from the route's handler to the answer,
 * and the exchanges in flight (`Inflight`, for `drain`); see server.ts.
 */
import { asServiceError, errors, isOutcomeUnknown, OutcomeUnknown, ServiceError, withHeaders } from '../errors.js';
import type { IngestSink } from '../validation-pool/index.js';
import type { ClientLimiter, ClientSlot } from './client-limiter.js';
import type { BodyStream, BufferedHandler, Reply, Request, ServerOptions, StreamingHandler, WireExchange, WireReply } from './types.js';

/** How long a request timeout waits for a handler past its point of no return (`BodyStream.hold`): a recording's store write, retries included. */
export const HOLD_MS = 30_000;

/**
 * The bytes of buffered bodies all exchanges hold (`ServerLimits.bufferedBodyBytes`): they are
 * read before authentication, so without a bound any number of connections from enough
 * addresses could each hold a body of `otherBodyBytes`. A request that holds all there is may
 * always go on (its own limit is `otherBodyBytes`); else one past the bound is refused.
 */
export class HeldBodies {
  #used = 0;

  constructor(readonly limit: number) {}

  /** Holds `bytes` more for an exchange that holds `own` already: false (nothing held) past the bound. */
  take(bytes: number, own: number): boolean {
    if (this.#used + bytes > this.limit && this.#used > own) return false;
    this.#used += bytes;
    return true;
  }

  give(bytes: number): void {
    this.#used -= bytes;
  }
}

/** The exchanges not yet done (answered or aborted, and their handler settled), for `drain`. */
export class Inflight {
  readonly #live = new Set<Exchange>();
  draining = false;
  #idle: (() => void) | undefined;

  constructor(readonly bodies: HeldBodies = new HeldBodies(Number.POSITIVE_INFINITY)) {}

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
export class Exchange {
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
  /** Bytes of a buffered body held (`HeldBodies`), given back once answered and the handler settled. */
  private heldBody = 0;
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
    /** The route's `answerHeaders` for this request: on the answers the exchange gives itself too. */
    private readonly answerHeaders?: Readonly<Record<string, string>>,
  ) {
    inflight.add(this);
    wire.onAborted(() => {
      const answered = this.finished;
      this.finished = true;
      this.teardown(false);
      if (!answered) this.observed('aborted');
      this.release();
    });
    wire.onMalformedBody?.(() => this.fail(errors.malformedRequest(), true));
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
        if (!this.inflight.bodies.take(chunk.byteLength, this.heldBody)) {
          this.fail(errors.rateLimited(1), true);
          return;
        }
        this.heldBody += chunk.byteLength;
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
   * answer (a recorded package's 200) is then waited for `holdGraceMs` longer, so that no client
   * is told 408 about a package that gets stored; still unanswered then, its outcome is
   * unknown: the connection is closed without an answer (errors.ts `OutcomeUnknown`).
   */
  private timedOut(): void {
    if (this.holding && !this.finished) {
      this.holding = false;
      const graceMs = this.opts.holdGraceMs ?? HOLD_MS;
      this.timer = setTimeout(() => this.unanswered(new OutcomeUnknown(`Past the request timeout and ${graceMs} ms more, the package's record was still being written`)), graceMs);
      this.timer.unref();
      return;
    }
    this.fail(errors.requestTimeout(), true);
  }

  /**
   * Closes the connection without an answer: any answer would claim an outcome nobody knows
   * (`OutcomeUnknown`). Finished at once, so a handler that settles later is not answered.
   */
  private unanswered(err: OutcomeUnknown): void {
    if (this.finished) return;
    this.opts.onUnanswered?.(err, this.req);
    this.finished = true;
    this.teardown(false);
    this.observed('aborted');
    this.wire.destroy();
    this.release();
  }

  fail(err: ServiceError, closeConnection: boolean): void {
    this.send(replyFor(this.answerHeaders ? withHeaders(err, this.answerHeaders) : err), closeConnection);
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
        if (isOutcomeUnknown(err)) return this.unanswered(err);
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
    this.inflight.bodies.give(this.heldBody);
    this.heldBody = 0;
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

export function wireReply(reply: Reply, requestId: string): WireReply {
  const body = reply.raw !== undefined ? (reply.body as string | Uint8Array) : JSON.stringify(reply.body ?? null);
  const headers: [string, string][] = [
    ['Content-Type', reply.raw?.contentType ?? 'application/json'],
    ['X-Request-Id', requestId],
  ];
  for (const [k, v] of Object.entries(reply.headers ?? {})) headers.push([k, v]);
  return { status: reply.status, headers, body };
}

export function replyFor(err: ServiceError): Reply {
  return { status: err.statusCode, body: err.body, headers: { ...err.headers } };
}

function copy(chunk: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(chunk.byteLength);
  out.set(chunk);
  return out;
}
