/**
 * The edge's adapter on `node:http` (llhttp): every Node the service supports, strict
 * framing by its parser (two `Content-Length`s, `Transfer-Encoding` with `Content-Length`,
 * a coding other than `chunked` last: refused before the request callback), HTTP/1.0, and
 * pipelining (responses are written in request order).
 *
 * What reaches the core is checked again there (`request-head.ts`), so the two adapters
 * refuse alike; what llhttp refuses never reaches it, and is answered here through the
 * core's `refused`, in the contract's shape, instead of Node's bodiless default.
 */
import { createServer, STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { errors, type ServiceError } from '../errors.js';
import { normaliseAddress } from './auth.js';
import type { EdgeAdapter, WireExchange, WireHandlers, WireHead, WireListener, WireReply } from './types.js';

/**
 * How long a client may take to send a complete head (408 after), and how long an idle
 * keep-alive connection stays open: the uWS build's fixed 10 s, so both edges hold a
 * silent connection equally long.
 */
const HEAD_TIMEOUT_MS = 10_000;
const IDLE_KEEP_ALIVE_MS = 10_000;
/** How often Node checks the head timeout of open connections. */
const CHECK_CONNECTIONS_EVERY_MS = 1_000;
const EMPTY = new Uint8Array(0);

export const nodeEdge: EdgeAdapter = {
  name: 'node',
  listen(host, port, handlers) {
    const server = createServer({
      // The core answers a missing or repeated Host (400) in the contract's shape.
      requireHostHeader: false,
      headersTimeout: HEAD_TIMEOUT_MS,
      keepAliveTimeout: IDLE_KEEP_ALIVE_MS,
      // The core's `limits.requestTimeoutMs` and body-rate window time the rest.
      requestTimeout: 0,
      connectionsCheckingInterval: CHECK_CONNECTIONS_EVERY_MS,
    });
    /** Exchanges of a connection not yet answered: a refusal written then would be read as their answer. */
    const pending = new WeakMap<Duplex, number>();
    /** Connections answered with `Connection: close`: what their parser reads after is never answered. */
    const closed = new WeakSet<Duplex>();
    /** Each connection's latest exchange: the one whose body llhttp is reading, until it is complete. */
    const latest = new WeakMap<Duplex, NodeExchange>();
    let closing = false;

    const onRequest = (req: IncomingMessage, res: ServerResponse): void => {
      const socket = req.socket;
      pending.set(socket, (pending.get(socket) ?? 0) + 1);
      const exchange = new NodeExchange(
        req,
        res,
        (close) => {
          pending.set(socket, pending.get(socket)! - 1);
          if (close) closed.add(socket);
        },
        () => closing,
      );
      latest.set(socket, exchange);
      handlers.request(wireHead(req), exchange);
    };
    server.on('request', onRequest);
    // An `Expect` other than `100-continue` is served like any request, as on uWS (RFC 9110
    // §10.1.1 allows it), instead of node:http's bodiless 417 without an X-Request-Id.
    server.on('checkExpectation', onRequest);
    // node:http hands a CONNECT over as a tunnel, and without this listener closes it
    // unanswered. No route takes CONNECT: the core answers it like any request (405 or 404,
    // as on uWS), and the connection is closed after.
    server.on('connect', (req: IncomingMessage, socket: Duplex) => handlers.request(wireHead(req), new TunnelExchange(socket)));

    server.on('clientError', (err: NodeJS.ErrnoException & { reason?: string }, socket: Duplex) => {
      // Bytes after a request answered with `Connection: close` (llhttp read on, as in a
      // request whose Transfer-Encoding the core refused): the close is already on its way.
      // Or after a request that asked for it (HPE_CLOSED_CONNECTION): never served (RFC 9112
      // §9.6), and that request's answer, still to come, closes the connection.
      if (closed.has(socket) || err.code === 'HPE_CLOSED_CONNECTION') return;
      // The connection is gone.
      if (err.code === 'ECONNRESET' || !socket.writable) {
        socket.destroy();
        return;
      }
      // A body whose framing broke (a bad chunk size; llhttp's refusal, not the client leaving
      // mid-body, HPE_INVALID_EOF_STATE): its request is answered 400, then closed.
      const framing = err.code?.startsWith('HPE_') && err.code !== 'HPE_INVALID_EOF_STATE';
      if (framing && latest.get(socket)?.malformedBody()) return;
      // An answer now would be read as an earlier request's.
      if ((pending.get(socket) ?? 0) > 0) {
        socket.destroy();
        return;
      }
      const remote = normaliseAddress((socket as Duplex & { remoteAddress?: string }).remoteAddress ?? '');
      socket.end(serialise(handlers.refused(parserProblem(err), remote), true));
    });

    return new Promise<WireListener | false>((resolve, reject) => {
      const failed = (err: NodeJS.ErrnoException) => (err.code === 'EADDRINUSE' ? resolve(false) : reject(err));
      server.once('error', failed);
      server.listen({ host, port }, () => {
        server.off('error', failed);
        const address = server.address();
        resolve({
          port: typeof address === 'object' && address ? address.port : port,
          close() {
            if (closing) return;
            closing = true;
            // Idle keep-alive connections close now; busy ones after their response (`Connection: close`).
            server.close();
            server.closeIdleConnections();
          },
        });
      });
    });
  },
};

/** The head of a request as llhttp delivered it. */
function wireHead(req: IncomingMessage): WireHead {
  const raw = req.rawHeaders;
  const fields: [string, string][] = [];
  for (let i = 0; i + 1 < raw.length; i += 2) fields.push([raw[i]!.toLowerCase(), raw[i + 1]!]);
  const target = req.url ?? '';
  const q = target.indexOf('?');
  return {
    method: req.method ?? '',
    path: q < 0 ? target : target.slice(0, q),
    query: q < 0 ? '' : target.slice(q + 1),
    httpVersion: req.httpVersion,
    fields,
    remoteAddress: normaliseAddress(req.socket.remoteAddress ?? ''),
  };
}

/** What llhttp's refusal means in the contract's terms. */
function parserProblem(err: NodeJS.ErrnoException & { reason?: string }): ServiceError {
  // llhttp files Content-Length beside Transfer-Encoding under a Content-Length code (which
  // one depends on its version); only its reason names the conflict.
  if (err.code?.endsWith('CONTENT_LENGTH') && err.reason?.includes('Transfer-Encoding')) return errors.conflictingFraming();
  switch (err.code) {
    case 'HPE_HEADER_OVERFLOW':
      return errors.headersTooLarge();
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return errors.requestTimeout();
    case 'HPE_INVALID_TRANSFER_ENCODING':
      return errors.invalidTransferEncoding();
    case 'HPE_INVALID_CONTENT_LENGTH':
    case 'HPE_UNEXPECTED_CONTENT_LENGTH':
      return errors.invalidContentLength();
    case 'HPE_INVALID_VERSION':
      // llhttp files a request line not ended by CRLF (a bare LF, a space after `HTTP/1.1`)
      // under this code too: its version may be 1.1, and the request is malformed.
      return err.reason?.startsWith('Expected CRLF') ? errors.malformedRequest() : errors.httpVersionNotSupported();
    default:
      return errors.malformedRequest();
  }
}

/** A whole response as bytes, for a socket no `ServerResponse` owns. */
function serialise(reply: WireReply, close: boolean): Buffer {
  const body = typeof reply.body === 'string' ? Buffer.from(reply.body) : reply.body;
  let head = `HTTP/1.1 ${reply.status} ${STATUS_CODES[reply.status] ?? ''}\r\n`;
  for (const [k, v] of reply.headers) head += `${k}: ${v}\r\n`;
  head += `Content-Length: ${body.byteLength}\r\n${close ? 'Connection: close\r\n' : ''}\r\n`;
  return Buffer.concat([Buffer.from(head, 'latin1'), body]);
}

class NodeExchange implements WireExchange {
  #done = false;
  #aborted: (() => void) | undefined;
  #malformed: (() => void) | undefined;

  constructor(
    private readonly req: IncomingMessage,
    private readonly res: ServerResponse,
    /** Answered (`close`: with `Connection: close`) or aborted. */
    private readonly settled: (close: boolean) => void,
    private readonly closing: () => boolean,
  ) {
    // A client gone mid-body destroys the request with an error; the close below reports it.
    req.on('error', () => {});
    res.once('close', () => {
      if (this.#done) return;
      this.#done = true;
      this.settled(true);
      this.#aborted?.();
    });
  }

  onAborted(cb: () => void): void {
    this.#aborted = cb;
  }

  onMalformedBody(cb: () => void): void {
    this.#malformed = cb;
  }

  /** llhttp refused bytes while this request's body was incomplete: true once it is answered. */
  malformedBody(): boolean {
    if (this.#done || this.req.complete || !this.#malformed) return false;
    this.#malformed();
    return this.#done;
  }

  onData(cb: (chunk: Uint8Array, last: boolean) => void): void {
    this.req.on('data', (chunk: Buffer) => cb(chunk, false));
    this.req.once('end', () => cb(EMPTY, true));
  }

  pause(): void {
    this.req.pause();
  }

  resume(): void {
    this.req.resume();
  }

  respond(reply: WireReply, close: boolean): void {
    if (this.#done) return;
    this.#done = true;
    const closing = close || this.closing();
    this.settled(closing);
    const body = typeof reply.body === 'string' ? Buffer.from(reply.body) : reply.body;
    const headers: string[] = [];
    for (const [k, v] of reply.headers) headers.push(k, v);
    headers.push('Content-Length', String(body.byteLength));
    if (closing) headers.push('Connection', 'close');
    this.res.writeHead(reply.status, headers);
    this.res.end(body);
  }

  destroy(): void {
    if (!this.#done) this.req.socket.destroy();
  }
}

/**
 * A CONNECT's exchange on the socket node:http gave up (no `ServerResponse`): the head has
 * no body after it (what follows would be the tunnel's), and any answer closes the socket.
 */
class TunnelExchange implements WireExchange {
  #done = false;
  #aborted: (() => void) | undefined;

  constructor(private readonly socket: Duplex) {
    socket.on('error', () => {});
    socket.once('close', () => {
      if (this.#done) return;
      this.#done = true;
      this.#aborted?.();
    });
  }

  onAborted(cb: () => void): void {
    this.#aborted = cb;
  }

  onData(cb: (chunk: Uint8Array, last: boolean) => void): void {
    cb(EMPTY, true);
  }

  pause(): void {}

  resume(): void {}

  respond(reply: WireReply): void {
    if (this.#done) return;
    this.#done = true;
    this.socket.end(serialise(reply, true));
  }

  destroy(): void {
    if (!this.#done) this.socket.destroy();
  }
}
