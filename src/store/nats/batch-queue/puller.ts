/**
 * The pull requests (`$JS.API.CONSUMER.MSG.NEXT`) of one `consume` loop, written by hand.
 *
 * Why not nats.js's consumer API (`js.consumers.get(stream, durable)` and its `consume`,
 * `fetch` or `next`), checked against nats 2.29.3:
 * - `consume()` pulls the next message as soon as one arrives (its refill threshold is at
 *   least one message): while the handler uploads a package, another one would wait in this
 *   process with its ack wait running and no heartbeat. It is redelivered to another
 *   uploader after the ack wait while this one may still take it: a package stored twice,
 *   and one held back from idle uploaders meanwhile. We pull one only when the last is done.
 * - `fetch({ max_messages: 1 })` and `next()` pull one at a time, but stopping them
 *   unsubscribes the inbox at once: a message the server already sent to a waiting pull is
 *   then lost to nobody, and only the ack wait (5 min by default) brings it back. A stopping
 *   uploader (SIGTERM, a rolling restart) would hold back a package that long. Here `stop()`
 *   ends the wait at once, and `close()` drains the inbox and naks whatever was on its way,
 *   so another consumer takes it at once. Waiting out the pull's expiry instead would make
 *   every stop as slow as one pull.
 * What nats.js does give is used: deliveries are read as its `JsMsg` (delivery count and
 * stream sequence from `info`, `working()`, `nak(delay)`; see consumer.ts), so no ack
 * subject is parsed here. The consumer itself is created and updated with `jsm.consumers`.
 * test/contract/nats-puller.test.ts covers this file.
 */
import { createInbox, nanos, type Msg, type Subscription } from 'nats';
import { toJsMsg } from 'nats/lib/jetstream/jsmsg.js';
import type { NatsContext } from '../connection.js';

/**
 * Pull requests of one `consume` loop, one message at a time, on one inbox. `stop()` ends
 * the wait at once; `close()` drains the inbox, and a delivery that was already on its way
 * is nak'ed at once so another consumer takes it without waiting for the ack wait.
 */
export class Puller {
  readonly #ctx: NatsContext;
  readonly #subject: string;
  readonly #expiresMs: number;
  readonly #heartbeatMs: number;
  readonly #inbox = createInbox();
  readonly #sub: Subscription;
  readonly #ready: Msg[] = [];
  #outstanding = false;
  /** What the last pull that ended without a message asks of the loop. */
  #after: 'again' | 'pause' | 'retry' = 'again';
  #stopped = false;
  #closed = false;
  #wake: (() => void) | undefined;
  #timer: NodeJS.Timeout | undefined;

  constructor(ctx: NatsContext, stream: string, durable: string, expiresMs: number) {
    this.#ctx = ctx;
    this.#subject = `$JS.API.CONSUMER.MSG.NEXT.${stream}.${durable}`;
    this.#expiresMs = expiresMs;
    this.#heartbeatMs = Math.min(5000, Math.max(500, Math.floor(expiresMs / 5)));
    this.#sub = ctx.nc.subscribe(this.#inbox, { callback: (err, msg) => (err ? this.#ended('pause') : this.#receive(msg)) });
  }

  /**
   * The next delivery; null once stopped (or the connection closed). 'pause': the server
   * refused the pull for now (too many waiting, a leader moving), wait a little. 'retry': the
   * consumer seems gone: make sure it exists, then wait a little.
   */
  async next(): Promise<Msg | 'pause' | 'retry' | null> {
    for (;;) {
      if (this.#stopped || this.#ctx.nc.isClosed()) return null;
      const ready = this.#ready.shift();
      if (ready) return ready;
      const after = this.#after;
      this.#after = 'again';
      if (after !== 'again') return after;
      if (!this.#outstanding) this.#request();
      await new Promise<void>((resolve) => (this.#wake = resolve));
    }
  }

  /** Waits `ms` unless stopped first. */
  pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      if (this.#stopped) return resolve();
      const timer = setTimeout(() => this.#signal(), ms);
      this.#wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  stop(): void {
    this.#stopped = true;
    this.#signal();
  }

  async close(): Promise<void> {
    this.#stopped = true;
    this.#closed = true;
    clearTimeout(this.#timer);
    for (const msg of this.#ready.splice(0)) nakNow(msg);
    if (this.#ctx.nc.isClosed()) return;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      this.#sub.drain().catch(() => {}),
      new Promise<void>((resolve) => (timer = setTimeout(resolve, this.#ctx.requestTimeoutMs))),
    ]);
    clearTimeout(timer);
    if (!this.#sub.isClosed()) this.#sub.unsubscribe();
  }

  #request(): void {
    this.#outstanding = true;
    clearTimeout(this.#timer);
    try {
      const pull = { batch: 1, expires: nanos(this.#expiresMs), idle_heartbeat: nanos(this.#heartbeatMs) };
      this.#ctx.nc.publish(this.#subject, Buffer.from(JSON.stringify(pull)), { reply: this.#inbox });
    } catch {
      // Closing or closed: next() notices; anything else, try again after a pause.
      this.#outstanding = false;
      this.#after = 'pause';
      return;
    }
    this.#watch();
  }

  /** A waiting pull hears an idle heartbeat every `#heartbeatMs`; two missed ones mean it was lost with a server or a leader. */
  #watch(): void {
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => this.#ended('again'), 2 * this.#heartbeatMs + 1000);
    this.#timer.unref();
  }

  #receive(msg: Msg): void {
    if (msg.reply?.startsWith('$JS.ACK.')) {
      if (this.#closed) {
        nakNow(msg);
        return;
      }
      this.#ready.push(msg);
      this.#ended('again');
      return;
    }
    const code = msg.headers?.code ?? 0;
    if (code === 100) {
      if (this.#outstanding) this.#watch(); // idle heartbeat: the pull is still waiting on the server
      return;
    }
    // 408: the pull expired; 404: nothing (no-wait). 409: max waiting, leadership change, or consumer deleted. 503: no consumer there.
    if (code === 408 || code === 404) this.#ended('again');
    else if (code === 503 || (code === 409 && /deleted/i.test(msg.headers?.description ?? ''))) this.#ended('retry');
    else this.#ended('pause');
  }

  #ended(after: 'again' | 'pause' | 'retry'): void {
    clearTimeout(this.#timer);
    this.#outstanding = false;
    this.#after = after;
    this.#signal();
  }

  #signal(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }
}

/** A delivery this loop will not handle: back to the consumer for anyone to take, at once. */
function nakNow(msg: Msg): void {
  quietly(() => toJsMsg(msg).nak());
}

/** Ack-protocol replies are fire-and-forget: a closed connection drops them, and the ack wait redelivers. */
export function quietly(reply: () => void): void {
  try {
    reply();
  } catch {
    // see above
  }
}
