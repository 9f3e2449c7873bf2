/**
 * One `consume` loop: takes commit messages from the durable pull consumer one at a time,
 * hands their packages to the handler, and acks (then deletes the batches; the commit goes
 * with the next bulk removal, remover.ts), naks with a growing delay, or drops a package
 * whose batches are gone.
 */
import { crc32 } from 'node:zlib';
import { DirectMsgHeaders, type JsMsg, type Msg } from 'nats';
import { toJsMsg } from 'nats/lib/jetstream/jsmsg.js';
import { isStoreError, StoreError, type CommittedPackage, type QueueConsumer } from '../../ports.js';
import { damagedReads } from '../connection.js';
import type { StreamMessages } from './messages.js';
import { Puller, quietly } from './puller.js';
import { readCommit, type CommitRecord } from './record.js';
import type { QueueSubjects } from './subjects.js';

const MAX_DELAY_MS = 30_000;
/** Deliveries of a commit message that does not read as one before it is dropped (over about 2.5 min at the default delay). */
const UNREADABLE_DELIVERIES = 10;
const ACK = Buffer.from('+ACK');

export interface ConsumerOptions {
  messages: StreamMessages;
  subjects: QueueSubjects;
  durable: string;
  redeliveryDelayMs: number;
  ackWaitMs: number;
  pullExpiresMs: number;
  readAhead: number;
  /** Makes sure the durable consumer exists (it went away: deleted, not yet on a new leader). */
  ensureConsumer(): Promise<void>;
  /** The server confirmed the ack of the commit message at this stream sequence. */
  acked(seq: number): void;
  /** Once the loop has ended: removes from the stream what this loop acked (never throws). */
  settle(): Promise<void>;
  onError(err: unknown, what: string): void;
}

export class NatsConsumer implements QueueConsumer {
  readonly #o: ConsumerOptions;
  readonly #puller: Puller;
  readonly #loop: Promise<void>;
  /** Called once the loop has ended (the queue forgets this consumer). */
  readonly #onStopped: () => void;
  #stopping: Promise<void> | undefined;

  constructor(opts: ConsumerOptions, handler: (pkg: CommittedPackage) => Promise<void>, onStopped: () => void) {
    this.#o = opts;
    this.#onStopped = onStopped;
    this.#puller = new Puller(opts.messages.ctx, opts.messages.stream, opts.durable, opts.pullExpiresMs);
    this.#loop = this.#run(handler);
  }

  stop(): Promise<void> {
    return (this.#stopping ??= (async () => {
      this.#puller.stop();
      await this.#loop;
      await this.#o.settle();
      this.#onStopped();
    })());
  }

  async #run(handler: (pkg: CommittedPackage) => Promise<void>): Promise<void> {
    const puller = this.#puller;
    try {
      for (;;) {
        const msg = await puller.next();
        if (msg === null) break;
        if (msg === 'retry') {
          // The consumer went away (deleted, not yet created on a new leader): make sure it exists, then ask again.
          await this.#o.ensureConsumer().catch((err: unknown) => this.#o.onError(err, 'recreate the queue consumer'));
        }
        if (msg === 'retry' || msg === 'pause') {
          await puller.pause(1000);
          continue;
        }
        await this.#deliver(msg, handler);
      }
    } finally {
      await puller.close();
    }
  }

  async #deliver(msg: Msg, handler: (pkg: CommittedPackage) => Promise<void>): Promise<void> {
    const { messages, subjects, onError } = this.#o;
    const jm = toJsMsg(msg, messages.ctx.requestTimeoutMs);
    const { deliveryCount, streamSequence } = jm.info;
    let rec: CommitRecord;
    /** The package's only batch, when the commit message carries it. */
    let inline: Uint8Array | null;
    try {
      ({ rec, inline } = readCommit(msg));
    } catch (err) {
      damagedReads.count++;
      // Bytes unlike any commit a gateway writes were damaged on their way (the server checks its
      // own blocks; nats-server issue 7842 mixes consumer data with route protocol in a
      // cluster): delivered again, read afresh. Dropped only when they never read otherwise.
      if (deliveryCount < UNREADABLE_DELIVERIES) {
        onError(err, `unreadable commit message ${msg.subject} (delivery ${deliveryCount}): delivered again`);
        this.#later(jm);
        return;
      }
      onError(err, `drop unreadable commit message ${msg.subject} after ${deliveryCount} deliveries`);
      await this.#ack(msg, streamSequence);
      return;
    }
    const batchSubject = subjects.batchOfCommit(msg.subject);
    let lost: Error | undefined;
    const heartbeat = setInterval(() => quietly(() => jm.working()), Math.max(100, Math.min(this.#o.ackWaitMs / 3, 30_000)));
    heartbeat.unref(); // the handler's own work keeps the process alive, not its heartbeat
    let ok = false;
    try {
      await handler({
        meta: rec.meta,
        rows: rec.rows,
        bytes: rec.bytes,
        attempt: deliveryCount,
        batches: () =>
          checked(
            rec,
            inline
              ? (async function* () {
                  yield inline;
                })()
              : this.#read(rec.batches, batchSubject, (err) => {
                  lost = err;
                }),
          ),
      });
      ok = true;
    } catch {
      // A throwing handler is the redelivery signal; reporting is the handler's business.
    } finally {
      clearInterval(heartbeat);
    }
    if (ok) {
      // Stored and counted: its commit leaves the stream whether or not the ack was answered.
      // An ack that landed unanswered is never delivered again, and its commit, kept above the
      // ack floor, would read as pending in status (`upload_tasks_finished` false) while any
      // other package held the floor. One not landed finds its commit gone at redelivery, and the server moves on.
      if (!(await this.#ack(msg, streamSequence))) this.#o.acked(streamSequence);
      // One filtered purge of the package's own batch subject, however many batches it has.
      if (rec.batches.length > 0) {
        await messages.deleteMatching(batchSubject, Math.max(...rec.batches)).catch((err: unknown) => onError(err, 'delete the batches of an uploaded package'));
      }
      return;
    }
    if (lost) {
      // Redelivery cannot bring batches back: drop the package (ack removes it) and say so, unless a purge already took it.
      const stillThere = await messages
        .get({ seq: streamSequence })
        .then((sm) => sm !== null)
        .catch(() => true);
      if (stillThere) onError(lost, `drop package ${rec.meta.package_id} of session ${rec.meta.upload_uuid}: its batches are gone`);
      if (await this.#ack(msg, streamSequence)) await messages.deleteMatching(batchSubject).catch(() => {});
      return;
    }
    this.#later(jm);
  }

  /** Delivered again after the redelivery delay, doubled per delivery up to `MAX_DELAY_MS`. */
  #later(jm: JsMsg): void {
    const delayMs = this.#o.redeliveryDelayMs;
    const delay = Math.min(delayMs * 2 ** (jm.info.deliveryCount - 1), Math.max(delayMs, MAX_DELAY_MS));
    quietly(() => jm.nak(delay));
  }

  async *#read(seqs: number[], subject: string, onLost: (err: Error) => void): AsyncIterable<Uint8Array> {
    const ahead: Promise<Uint8Array>[] = [];
    const fetch = (seq: number): Promise<Uint8Array> => {
      const p = this.#batch(seq, subject).catch((err: unknown) => {
        if (isStoreError(err, 'QUEUE_BATCH_LOST')) onLost(err);
        throw err;
      });
      p.catch(() => {}); // awaited below, or abandoned with the reader
      return p;
    };
    let next = 0;
    for (let i = 0; i < seqs.length; i++) {
      while (next < seqs.length && next <= i + this.#o.readAhead) ahead.push(fetch(seqs[next++]!));
      yield await ahead.shift()!;
    }
  }

  /**
   * Direct get (raw bytes, any replica: about five times the throughput of STREAM.MSG.GET
   * with its base64 JSON); whatever it cannot answer, a lagging replica perhaps, the leader does.
   * So does an answer on another subject before the batch is judged lost: a damaged answer
   * must not drop a package.
   */
  async #batch(seq: number, subject: string): Promise<Uint8Array> {
    const direct = await this.#direct(seq);
    if (direct?.subject === subject) return direct.data;
    const sm = await this.#o.messages.get({ seq });
    if (!sm) throw new StoreError('QUEUE_BATCH_LOST', `Batch ${seq} of ${subject} is gone`);
    if (sm.subject !== subject) throw new StoreError('QUEUE_BATCH_LOST', `Batch ${seq} is not on ${subject}`);
    if (direct) damagedReads.count++; // a replica's answer was not what the leader holds
    return sm.data;
  }

  /** `$JS.API.DIRECT.GET` by sequence; null for anything but a message (not there, no answer, not enabled). */
  async #direct(seq: number): Promise<{ subject: string; data: Uint8Array } | null> {
    const { ctx, stream } = this.#o.messages;
    try {
      const r = await ctx.nc.request(`$JS.API.DIRECT.GET.${stream}`, Buffer.from(JSON.stringify({ seq })), {
        timeout: ctx.requestTimeoutMs,
      });
      const subject = r.headers?.get(DirectMsgHeaders.Subject);
      return subject && (r.headers?.code ?? 0) < 300 ? { subject, data: r.data } : null;
    } catch {
      return null;
    }
  }

  /**
   * Acks and waits for the server to confirm; false (reported) when it never did (the ack may
   * have landed all the same). Not
   * `JsMsg.ackAck()`: it marks the message acked before the server answers, so it cannot be
   * asked again after a timeout.
   */
  async #ack(msg: Msg, seq: number): Promise<boolean> {
    const { ctx } = this.#o.messages;
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        await ctx.nc.request(msg.reply!, ACK, { timeout: ctx.requestTimeoutMs });
        this.#o.acked(seq);
        return true;
      } catch (err) {
        if (attempt === 2 || ctx.nc.isClosed()) {
          this.#o.onError(err, `ack ${msg.subject}: no answer`);
          return false;
        }
      }
    }
    return false;
  }
}

/**
 * The package's batches as read, checked against the CRC-32 its commit carries: bytes that
 * differ (a transport that garbled them: seen once in the network drill, a delivery whose data
 * was cut short mid-row while nats.js's parser lost its framing) end the read with
 * `STORE_CORRUPT` after the last batch, before the body is complete, so the object is not
 * stored and the package is delivered again.
 */
async function* checked(rec: CommitRecord, batches: AsyncIterable<Uint8Array>): AsyncIterable<Uint8Array> {
  let crc = 0;
  for await (const b of batches) {
    crc = crc32(b, crc);
    yield b;
  }
  if (rec.crc !== undefined && crc !== rec.crc) {
    damagedReads.count++;
    throw new StoreError('STORE_CORRUPT', `Package ${rec.meta.package_id} read back does not match its commit (CRC-32 ${crc}, committed ${rec.crc})`);
  }
}
