/**
 * The HTTP edge as a port: what the API's handlers are given (a request head, a body they
 * pull through a sink with pause/resume, a reply they return) and what the composition root
 * asks of the edge. Two adapters implement the wire side (`uws-edge.ts` on uWebSockets.js,
 * `node-edge.ts` on `node:http`); routing, limits, timeouts, back-pressure, error bodies and
 * the access log are the edge core's (`server.ts`) and the same on both. Nothing above this
 * file knows which adapter runs.
 */
import type { BlockList } from 'node:net';
import type { ServiceError } from '../errors.js';
import type { IngestSink } from '../validation-pool/index.js';
import type { ClientLimits } from './client-limiter.js';

/** The adapters: `uws` (uWebSockets.js, where its native binary loads) and `node` (`node:http`, llhttp). */
export type EdgeName = 'uws' | 'node';

export interface Request {
  readonly method: string;
  readonly path: string;
  readonly query: string;
  /** Lower-cased header names. A header sent on several lines appears once (see `server.ts` for which are refused). */
  readonly headers: ReadonlyMap<string, string>;
  /** The peer address as seen on the socket. */
  readonly remoteAddress: string;
  /** The client's address after the trusted-proxy rule of `clientAddress` (what the per-client limits count). */
  readonly clientAddress: string;
  readonly params: Readonly<Record<string, string>>;
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

export interface BodyStream {
  /**
   * Starts delivering the body to `sink` (chunks that arrived earlier first). Call once.
   * Reading from the socket stops while `write` returns false, until the sink's `onDrain`.
   * The sink's `end()` is called once the body is complete, its `abort()` when the body
   * will never be (the client went away, or a limit or a timeout was answered first).
   * Resolves true once `end()` has settled (its outcome is the caller's to read from
   * `end()`), false when the body was abandoned first.
   */
  pipe(sink: IngestSink<unknown>): Promise<boolean>;
  /** Discards the body; the connection is closed after the response. */
  discard(): void;
  /**
   * The handler's point of no return (an ingest about to record its package): true when no
   * answer was sent and the client is still there — from then on a request timeout waits
   * (up to `HOLD_MS`) for the handler's own answer; false when the request was already
   * answered or abandoned, and the handler must not go on.
   */
  hold(): boolean;
}

export type BufferedHandler = (req: Request, body: Buffer) => Promise<Reply>;
export type StreamingHandler = (req: Request, body: BodyStream, signal: AbortSignal) => Promise<Reply>;

export type Route = (
  | { method: string; pattern: string; body: 'buffered'; handler: BufferedHandler }
  | { method: string; pattern: string; body: 'streaming'; handler: StreamingHandler }
) & {
  /**
   * Headers every answer to a request of this route carries, by its query: those the server
   * gives itself (413, 408, the limits' 503) as well as the handler's (ingest's `Dry-Run: true`).
   */
  answerHeaders?: (query: string) => Readonly<Record<string, string>>;
};

export interface ServerLimits extends ClientLimits {
  /**
   * The proxy in front limits each client's rate and connections: a request whose peer is a
   * trusted proxy is not counted again here (a peer that is not one still is).
   */
  perIpAtProxy?: boolean;
  /** Body limit of streaming (ingest) routes (413). */
  ingestBodyBytes: number;
  /** Body limit of every other request (413). */
  otherBodyBytes: number;
  /**
   * Bytes of buffered bodies (every route but ingest) held at once, all requests together,
   * read before authentication: a chunk past it answers 503 `Rate limit exceeded`, connection
   * closed, unless its request holds all there is (default `limits.bufferedBodyBytes`).
   */
  bufferedBodyBytes?: number;
  /** A request not answered by then: 408, connection closed. */
  requestTimeoutMs: number;
  /**
   * The minimum body rate. While the edge waits for body bytes (not while it paused the
   * socket itself), every `bodyRateWindowMs` must bring `minBodyBytesPerSecond` × the window
   * (or the end of the body); else 408 and the connection is closed. A trickle is cut after
   * one window, whatever the body's size.
   */
  bodyRateWindowMs: number;
  minBodyBytesPerSecond: number;
}

export interface ServerOptions {
  /** The wire adapter (`loadEdge` in `engine.ts`). */
  edge: EdgeAdapter;
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
  /** Called with what made a request answer 503 `Storage temporarily unavailable` (the store's own error). */
  onStorageUnavailable?: (err: unknown, req: Request) => void;
  /** Called when a request's connection is closed without an answer, its outcome unknown (errors.ts `OutcomeUnknown`). */
  onUnanswered?: (err: unknown, req: Request) => void;
  /** How long a request timeout waits for a handler past its point of no return (`BodyStream.hold`); default `HOLD_MS` (exchange.ts). */
  holdGraceMs?: number;
  /** Called once per request when it is answered or aborted (metrics, access log). */
  onResponse?: (event: ResponseEvent) => void;
  /** The per-client limiter's clock, in ms (default `performance.now`): only its differences count. */
  limiterClock?: () => number;
}

export interface Server {
  readonly port: number;
  /** Which adapter serves. */
  readonly edge: EdgeName;
  /** Closes the listen socket; requests in flight go on against whatever they use. */
  close(): void;
  /**
   * A graceful stop: closes the listen socket (new connections are refused), lets every request
   * in flight finish, its handler included, and answers each with `Connection: close`; a
   * request that arrives meanwhile on an open keep-alive connection is served the same way.
   * Resolves true once none is left; at `graceMs`, closes the connections of those still
   * running (their handlers see the abort) and resolves false.
   */
  drain(graceMs: number): Promise<boolean>;
}

// ---------------------------------------------------------------------------------------
// The wire side: what an adapter gives the edge core. Only `server.ts` and the adapters
// see these.

/** A request head as the adapter's parser delivered it. */
export interface WireHead {
  /** As sent; the core upper-cases it. */
  readonly method: string;
  /** The request target up to `?`, not decoded. */
  readonly path: string;
  /** After `?`, without it; '' when none. */
  readonly query: string;
  /** `1.1` or `1.0` (or what else the parser let through). */
  readonly httpVersion: string;
  /** Every header field line in the order sent: lower-cased name, value as the parser trimmed it. */
  readonly fields: readonly (readonly [string, string])[];
  readonly remoteAddress: string;
}

/** Status line, headers and body of one response, ready for the wire. */
export interface WireReply {
  readonly status: number;
  readonly headers: readonly (readonly [string, string])[];
  readonly body: string | Uint8Array;
}

/**
 * One request/response pair on the wire, owned by the core until it responded or the client
 * went away. Callbacks are attached at once, in the adapter's request callback.
 */
export interface WireExchange {
  /**
   * Body bytes, in order, then one call with `last` true (with or without bytes). The chunk
   * is valid only during the call: copy what is kept.
   */
  onData(cb: (chunk: Uint8Array, last: boolean) => void): void;
  /** The connection closed before a response was sent. Not called after `respond`. */
  onAborted(cb: () => void): void;
  /**
   * The body's framing broke mid-way (a bad chunk size): the exchange is answered with `cb`'s
   * `respond`, then the connection closes. Adapters whose parser drops such a connection
   * itself (uWS) never call it.
   */
  onMalformedBody?(cb: () => void): void;
  /** Stops reading the body from the socket (back-pressure, or the core is not ready for it). */
  pause(): void;
  resume(): void;
  /**
   * Writes the whole response (and undoes a pause); `close` ends the connection after it (the
   * body was not read to its end, a timeout, a drain). Nothing is called on the exchange after.
   */
  respond(reply: WireReply, close: boolean): void;
  /** Closes the connection at once, without a response. */
  destroy(): void;
}

/** What a wire adapter calls in the core. */
export interface WireHandlers {
  /** A request head and its exchange, in the adapter's request callback. */
  request(head: WireHead, exchange: WireExchange): void;
  /**
   * A request the adapter's parser refused, which never reaches `request` (bad framing, too
   * many or too large headers, headers not complete in time): the answer to write before the
   * connection is closed.
   */
  refused(problem: ServiceError, remoteAddress: string): WireReply;
}

/** A listening socket of an adapter. */
export interface WireListener {
  readonly port: number;
  /** Stops accepting connections; idempotent. */
  close(): void;
}

/**
 * An HTTP/1.1 server library behind the port. What it must do on its own (the core cannot):
 * frame requests, answer what never reaches `request` (a head its parser refuses) through
 * `refused` where its library lets it, and keep its own timers from cutting a body the core
 * still accepts (see `server.ts` for the core's timers).
 */
export interface EdgeAdapter {
  readonly name: EdgeName;
  /** Resolves with the listener, or false when the address is taken (the core retries). */
  listen(host: string, port: number, handlers: WireHandlers): Promise<WireListener | false>;
}
