/**
 * Group commit for one JetStream stream. Under `sync_interval: always` (every configuration
 * the project ships) the server fsyncs each message it stores before acknowledging it, one
 * at a time per stream; on nats-server 2.15 an atomic batch (ADR-50, 2.12+) is stored with
 * its syncs coalesced: about four per batch whatever its size, against one per message
 * (measured on 2.15.1: 20 batches of 2, 10 or 50 messages, 82 fsyncs each run; 200 single
 * publishes, 202). Three of the four are the batch's staging, a file store of its own under
 * the stream's directory, synced on any `sync_interval`. So the messages that wait while
 * `maxRounds` rounds are in flight go out together in the next round: as one atomic batch
 * when there are at least `BATCH_MIN` of them, else as single publishes. A message's promise
 * resolves once the server acknowledged it.
 *
 * nats.js 2.x has no batch publish (its successor's `@nats-io/jetstream` does): the batch is
 * the ADR's headers on plain publishes, the last one a request whose reply is the batch's
 * acknowledgement. A batch is stored whole or not at all: one that fails for any reason (a
 * compare-and-set of one of its messages lost, a timeout, a duplicate message id after a
 * re-send, a stream without `allow_atomic`, an older server) is published again message by
 * message through `publishOnce`, where each message gets its own answer. Message ids make
 * that safe for messages that carry one (a batch that did land answers with the original
 * acknowledgements; a compare-and-set that a single server refuses after its batch landed is
 * looked up, see `publishOnce`); the messages without one are plain puts that store the same
 * value again.
 *
 * Each message has one budget, `budgetMs` from its `publish`: the wait for a round, its batch
 * and the re-sends after it all come out of it, so a server that stopped answering fails a
 * message within that time (the ingest waiting on it answers 503), not a batch's timeout and
 * then a fresh budget later.
 */
import { headers as natsHeaders, nuid, type Msg, type MsgHdrs } from 'nats';
import { StoreError } from '../ports.js';
import { isNoResponders, publishOnce, type NatsContext } from './connection.js';

/** Fewer waiting messages than this go out one by one: a batch costs about four syncs. */
export const BATCH_MIN = 5;
/**
 * Rounds in flight at once per stream. Messages wait only while all of them are out, so a
 * light load goes out at once, message by message, and a heavy one in batches. Fewer rounds
 * make bigger batches and fewer syncs, but each message waits for a round to come back: with
 * 4, 64 packages in flight on one nats-server (`bench:packages`, `many`) were answered at
 * 450–500/s with `sync_interval: always` and 540–560/s on the default sync, at 2.75 syncs a
 * package; with 16, 590–630/s and 1,030–1,080/s, at 3.4 syncs (one run, alternating pairs);
 * 32 and 64 were no faster and synced more.
 */
export const MAX_ROUNDS = 16;
/** At most this many messages per batch (the server's limit is 1,000). */
const BATCH_MAX_MESSAGES = 256;
/** At most this many bytes of data per batch (the server stages a batch in memory). */
const BATCH_MAX_BYTES = 4 * 1024 * 1024;
/** A message with less of its budget left than this is failed, not sent: no answer could come back in time. */
const MIN_ATTEMPT_MS = 50;
/** "atomic publish is disabled": the stream was made or changed without `allow_atomic`. */
const JS_ATOMIC_PUBLISH_DISABLED = 10174;

export interface GroupMessage {
  subject: string;
  data: Uint8Array;
  /** Message id for the stream's duplicate window; without one the message must be safe to store twice. */
  msgID?: string;
  /** Compare-and-set: the subject's last sequence must be this (0: the subject holds nothing). */
  lastSubjectSequence?: number;
  headers?: () => MsgHdrs;
}

interface Waiting extends GroupMessage {
  /** When its budget ends (`Date.now()` time). */
  deadline: number;
  resolve: (seq: number) => void;
  reject: (err: unknown) => void;
}

export class GroupPublisher {
  readonly #ctx: NatsContext;
  readonly #stream: string;
  readonly #budgetMs: number;
  readonly #maxRounds: number;
  #atomic: boolean;
  #waiting: Waiting[] = [];
  /** Rounds in flight. */
  #rounds = 0;
  /** Rounds sent as one batch, and messages in them: what the tests and the bench read. */
  readonly stats = { batches: 0, batched: 0, single: 0 };

  /** `maxRounds`: rounds in flight at once (default `MAX_ROUNDS`); fewer for writes nobody waits for, in bigger batches. */
  constructor(ctx: NatsContext, stream: string, opts: { atomic: boolean; budgetMs: number; maxRounds?: number }) {
    this.#ctx = ctx;
    this.#stream = stream;
    this.#budgetMs = opts.budgetMs;
    this.#maxRounds = opts.maxRounds ?? MAX_ROUNDS;
    this.#atomic = opts.atomic;
  }

  /** Whether batches are sent (the stream allows atomic publish). */
  get atomic(): boolean {
    return this.#atomic;
  }

  /** Resolves with the message's stream sequence once the server acknowledged it. */
  publish(msg: GroupMessage): Promise<number> {
    return new Promise((resolve, reject) => {
      this.#waiting.push({ ...msg, deadline: Date.now() + this.#budgetMs, resolve, reject });
      this.#pump();
    });
  }

  /** Starts rounds while messages wait and fewer than `maxRounds` are in flight. */
  #pump(): void {
    while (this.#waiting.length > 0 && this.#rounds < this.#maxRounds) {
      const round = this.#take();
      this.#rounds++;
      const sent = this.#atomic && round.length >= BATCH_MIN ? this.#batch(round) : Promise.all(round.map((m) => this.#single(m)));
      void sent.finally(() => {
        this.#rounds--;
        this.#pump();
      });
    }
  }

  #take(): Waiting[] {
    let bytes = 0;
    let n = 0;
    while (n < this.#waiting.length && n < BATCH_MAX_MESSAGES) {
      bytes += this.#waiting[n]!.data.byteLength;
      if (n > 0 && bytes > BATCH_MAX_BYTES) break;
      n++;
    }
    return this.#waiting.splice(0, n);
  }

  /** `failed`: why the batch it was in did not land, the cause if its budget is spent now. */
  async #single(m: Waiting, failed?: unknown): Promise<void> {
    // A batch the server did not refuse (no answer in time) may have landed: a compare-and-set that loses now is looked up (publishOnce).
    const maybeLanded = failed !== undefined && !(failed as { refused?: boolean }).refused && !isNoResponders(failed);
    const left = m.deadline - Date.now();
    if (left < MIN_ATTEMPT_MS) {
      // Never sent, or in a batch the server refused or no stream took: not written for sure.
      m.reject(new StoreError('STORE_UNAVAILABLE', `NATS JetStream is unavailable: no acknowledgement within ${this.#budgetMs} ms`, { cause: failed, notWritten: !maybeLanded }));
      return;
    }
    this.stats.single++;
    try {
      const ack = await publishOnce(this.#ctx, m.subject, m.data, {
        ...(m.msgID ? { msgID: m.msgID } : {}),
        stream: this.#stream,
        budgetMs: left,
        ...(m.lastSubjectSequence === undefined ? {} : { lastSubjectSequence: m.lastSubjectSequence }),
        ...(m.headers ? { headers: m.headers } : {}),
        maybeLanded,
      });
      m.resolve(ack.seq);
    } catch (err) {
      m.reject(err);
    }
  }

  async #batch(round: Waiting[]): Promise<void> {
    try {
      // The round's first message waited longest: its budget bounds the batch's wait.
      const first = await publishAtomic(this.#ctx, this.#stream, round, Math.max(1, Math.min(this.#ctx.requestTimeoutMs, round[0]!.deadline - Date.now())));
      this.stats.batches++;
      this.stats.batched += round.length;
      round.forEach((m, i) => m.resolve(first + i));
    } catch (err) {
      if ((err as { errCode?: number }).errCode === JS_ATOMIC_PUBLISH_DISABLED) this.#atomic = false;
      // Whatever the batch did, each message alone now, within what is left of its budget: ids dedupe what did land.
      await Promise.all(round.map((m) => this.#single(m, err)));
    }
  }
}

/**
 * Publishes `messages` to `stream` as one atomic batch (ADR-50; the stream must allow atomic
 * publish): stored whole, as one run of sequences, or not at all. Resolves with the first
 * message's sequence; rejects when the server refused the batch (a compare-and-set of one of
 * its messages lost, a duplicate id, atomic publish off: `errCode`) or did not answer within
 * `timeoutMs` (then it may have landed).
 */
export async function publishAtomic(ctx: NatsContext, stream: string, messages: readonly GroupMessage[], timeoutMs = ctx.requestTimeoutMs): Promise<number> {
  const id = nuid.next();
  const { nc } = ctx;
  let answer!: Promise<Msg>;
  messages.forEach((m, i) => {
    const h = m.headers ? m.headers() : natsHeaders();
    h.set('Nats-Batch-Id', id);
    h.set('Nats-Batch-Sequence', String(i + 1));
    h.set('Nats-Expected-Stream', stream);
    if (m.msgID) h.set('Nats-Msg-Id', m.msgID);
    if (m.lastSubjectSequence !== undefined) h.set('Nats-Expected-Last-Subject-Sequence', String(m.lastSubjectSequence));
    if (i < messages.length - 1) nc.publish(m.subject, m.data, { headers: h });
    else {
      // The last message commits the batch; its reply is the batch's acknowledgement.
      h.set('Nats-Batch-Commit', '1');
      answer = nc.request(m.subject, m.data, { headers: h, timeout: timeoutMs });
    }
  });
  const ack = (await answer).json<{ error?: { err_code?: number; description?: string }; count?: number; seq?: number }>();
  if (ack.error || ack.count !== messages.length || typeof ack.seq !== 'number') {
    // `refused`: the server said no, so nothing of the batch is stored.
    throw Object.assign(new Error(`atomic batch refused: ${ack.error?.description ?? `count ${ack.count}`}`), { errCode: ack.error?.err_code, refused: ack.error !== undefined });
  }
  // A batch is stored as one run of sequences; the acknowledgement names its last.
  return ack.seq - messages.length + 1;
}
