/**
 * The edge's adapter on uWebSockets.js (the design's: the fastest receive path). The module
 * is handed in by `engine.ts`, which loads the native binary itself; nothing here imports
 * the package at run time (its own loader falls back to a slow pure-JS server).
 *
 * uWS lifetimes (uWS index.d.ts, ultimate-express): `onAborted` is attached first, every
 * header is read synchronously in the route callback, and every write outside that callback
 * happens inside `cork`.
 *
 * What this build (20.30, 2023) does before the route callback, and so cannot be changed
 * from here: it never answers an HTTP/1.0 request, an HTTP/1.1 one without `Host`, or a head
 * of more than 49 fields (it closes the connection after ~10 s); it frames a request by its
 * first `Content-Length` and reads any `Transfer-Encoding` as chunked (the core refuses both
 * from the header lines and closes the connection); and it closes a connection on which a
 * request arrives while the previous response is pending. Pausing the socket from the body's
 * end to the response would hold such a request back, but a paused uWS socket does not see
 * its client go away either: an ingest whose client vanished would then be committed and
 * stored instead of dropped (drill 5), so pipelining stays a limit of this edge.
 */
import { STATUS_CODES } from 'node:http';
import type * as UWS from 'uWebSockets.js';
import { normaliseAddress } from './auth.js';
import type { EdgeAdapter, WireExchange, WireHandlers, WireListener, WireReply } from './types.js';

export type UwsModule = typeof UWS;

/**
 * uWS's own timer (10 s, counted in 4 s ticks) closes a socket whose unpaused body brings
 * less than 160 KiB in a period, without an answer. `resume` re-arms it; the core's
 * body-rate window decides instead, so a body being read is paused and resumed this often.
 */
const KEEP_READING_EVERY_MS = 3_000;

export function uwsEdge(uWS: UwsModule): EdgeAdapter {
  const reading = new Reading();
  return {
    name: 'uws',
    async listen(host, port, handlers) {
      const app = uWS.App();
      app.any('/*', (res, req) => {
        const fields: [string, string][] = [];
        req.forEach((k, v) => fields.push([k, v]));
        const method = req.getCaseSensitiveMethod();
        const exchange = new UwsExchange(res, reading, method === 'HEAD');
        handlers.request(
          {
            method,
            path: req.getUrl(),
            query: req.getQuery() ?? '',
            // Only HTTP/1.1 reaches the route callback of this build.
            httpVersion: '1.1',
            fields,
            remoteAddress: normaliseAddress(Buffer.from(res.getRemoteAddressAsText()).toString()),
          },
          exchange,
        );
        exchange.returned();
      });
      const socket = await new Promise<UWS.us_listen_socket | false>((resolve) => app.listen(host, port, (s) => resolve(s)));
      if (!socket) return false;
      let listening = true;
      const listener: WireListener = {
        port: uWS.us_socket_local_port(socket),
        close() {
          // Closing a listen socket twice is a use after free in uSockets.
          if (listening) uWS.us_listen_socket_close(socket);
          listening = false;
        },
      };
      return listener;
    },
  };
}

class UwsExchange implements WireExchange {
  #inCallback = true;
  /** Answered or aborted: the response object is no longer ours. */
  #done = false;
  #paused = false;
  #bodyEnded = false;
  #aborted: (() => void) | undefined;
  /** The connection closed: the response object must not be touched. */
  #gone = false;

  constructor(
    private readonly res: UWS.HttpResponse,
    private readonly reading: Reading,
    /** An answer to HEAD has no body (RFC 9110 §9.3.2): bytes after its head would be read as the next answer. */
    private readonly head: boolean,
  ) {
    res.onAborted(() => {
      this.#gone = true;
      if (this.#done) return;
      this.#done = true;
      this.reading.delete(this);
      this.#aborted?.();
    });
  }

  /** The route callback returned: uWS arms its body timer now, paused or not; a pause from outside the callback disarms it. */
  returned(): void {
    this.#inCallback = false;
    if (this.#paused && !this.#done) setImmediate(() => this.#paused && !this.#done && this.res.pause());
  }

  onAborted(cb: () => void): void {
    this.#aborted = cb;
  }

  onData(cb: (chunk: Uint8Array, last: boolean) => void): void {
    this.res.onData((ab, isLast) => {
      if (isLast) {
        this.#bodyEnded = true;
        this.reading.delete(this);
      }
      cb(new Uint8Array(ab), isLast);
    });
    if (!this.#paused) this.reading.add(this);
  }

  pause(): void {
    if (this.#paused || this.#done) return;
    this.#paused = true;
    this.reading.delete(this);
    this.res.pause();
  }

  resume(): void {
    if (!this.#paused || this.#done) return;
    this.#paused = false;
    this.res.resume();
    if (!this.#bodyEnded) this.reading.add(this);
  }

  /** Re-arms uWS's body timer (see KEEP_READING_EVERY_MS). */
  keepReading(): void {
    this.res.pause();
    this.res.resume();
  }

  respond(reply: WireReply, close: boolean): void {
    if (this.#done) return;
    this.#done = true;
    this.reading.delete(this);
    const write = () => {
      // A paused socket stays paused after the response; the next request on it would hang.
      if (this.#paused) {
        this.#paused = false;
        this.res.resume();
      }
      this.res.writeStatus(`${reply.status} ${STATUS_CODES[reply.status] ?? ''}`.trimEnd());
      for (const [k, v] of reply.headers) this.res.writeHeader(k, v);
      // Every route is GET or POST: HEAD is always answered with an error, whose length is of no use (0 here).
      this.res.end(this.head ? '' : reply.body, close);
    };
    if (!this.#inCallback) this.res.cork(write);
    // Inside the route callback uWS has corked the socket already. But it goes on parsing the
    // rest of that read once the callback returns, and a closing answer given now would let it
    // serve a request smuggled behind an ambiguous head; given on the next turn, the response
    // is pending when such a request comes, and uWS drops the connection instead.
    else if (close) setImmediate(() => this.#gone || this.res.cork(write));
    else write();
  }

  destroy(): void {
    if (!this.#done) this.res.close();
  }
}

/** The exchanges whose body is being read, kept alive against uWS's timer by one shared interval. */
class Reading {
  readonly #live = new Set<UwsExchange>();
  #timer: NodeJS.Timeout | undefined;

  add(e: UwsExchange): void {
    this.#live.add(e);
    if (this.#timer) return;
    this.#timer = setInterval(() => {
      // Stopped on a tick rather than at every last delete: a status poll adds and deletes once.
      if (this.#live.size === 0) {
        clearInterval(this.#timer);
        this.#timer = undefined;
      }
      for (const live of this.#live) live.keepReading();
    }, KEEP_READING_EVERY_MS);
    this.#timer.unref();
  }

  delete(e: UwsExchange): void {
    this.#live.delete(e);
  }
}
