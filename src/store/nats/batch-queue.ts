import {
  AckPolicy,
  headers,
  createInbox,
  DeliverPolicy,
  DirectMsgHeaders,
  DiscardPolicy,
  nanos,
  ReplayPolicy,
  RetentionPolicy,
  StorageType,
  type ConsumerConfig,
  type Msg,
  type MsgHdrs,
  type MsgRequest,
  type StoredMsg,
  type StreamConfig,
  type Subscription,
} from 'nats';
import type { BatchQueue, CommittedPackage, PackageMeta, PackageWriter, QueueBacklog, QueueConsumer } from '../ports.js';
import { JS_NO_MESSAGE_FOUND, jsErrorCode, publishOnce, withRetry, type NatsContext } from './connection.js';

export interface NatsBatchQueueOptions {
  /** Stream name (`[A-Za-z0-9_-]+`); it is also the first token of every subject. */
  stream: string;
  /** Replicas of the stream (its consumer follows). Applied to an existing stream too. */
  replicas: number;
  /** The one durable pull consumer every `consume` of every process shares. */
  durable: string;
  /**
   * Hard age limit of every message, committed or not (default 0: none). Orphaned batches are
   * removed by the sweep below; set this only as a last resort: it drops committed packages
   * that no uploader took in time.
   */
  maxAgeMs?: number;
  /** Size limit of the stream (default: none). When full, appends fail; nothing queued is dropped. */
  maxBytes?: number;
  /** First redelivery delay after a handler throws; doubles per attempt, capped at 30 s (default 1000). */
  redeliveryDelayMs?: number;
  /** Ack wait of the consumer; heartbeats while a handler runs keep a slow upload its package (default 300000). */
  ackWaitMs?: number;
  /** Packages handed out and not yet acked, over all consumers of all processes (default 1000). */
  maxAckPending?: number;
  /** How long one publish, read or delete keeps retrying through transient failures (default 10000). */
  retryMs?: number;
  /** Expiry of one pull request; an idle consumer asks again after it (default 10000, at least 1000). */
  pullExpiresMs?: number;
  /** Batches of a package with no commit and no append for this long belong to a dead writer (default 3600000). */
  orphanAfterMs?: number;
  /** How often this instance sweeps orphaned batches away (default 600000; 0: never, call `sweep()` yourself). */
  sweepIntervalMs?: number;
  /** Batches read ahead of the one the handler consumes (default 3: with the one in hand, 2 MiB of 512 KiB batches). */
  readAhead?: number;
  /** Background failures: sweeps, acks, deletes after an ack, dropped packages. */
  onError?: (err: unknown, what: string) => void;
}

/** The commit message: everything a consumer needs, batches named by stream sequence in append order. */
interface CommitRecord {
  meta: PackageMeta;
  rows: number;
  bytes: number;
  batches: number[];
}

const MAX_DELAY_MS = 30_000;
/**
 * Header of a commit message that carries its package's only batch as its data (the commit
 * record, base64url JSON, is in the header then). A package of one batch up to this size
 * costs one publish instead of two; packages written before this existed still work.
 */
const INLINE_COMMIT = 'Ingest-Commit';
const INLINE_BATCH_BYTES = 256 * 1024;
const NAME = /^[A-Za-z0-9_-]+$/;
const PLAIN_TOKEN = /^[A-Za-z0-9_-]+$/;
const JS_STREAM_NOT_FOUND = 10059;
const JS_CONSUMER_NOT_FOUND = 10014;
const JS_STREAM_NAME_IN_USE = 10058;
/** "no message found" of a message delete. */
const JS_DELETE_FAILED = 10057;

/**
 * `BatchQueue` on one JetStream stream with work-queue retention and file storage.
 *
 * ```
 * <stream>.b.<client hex>.<upload_uuid>.<entity>.<package_id>   batches, msg id <package_id>:<n>
 * <stream>.c.<client hex>.<upload_uuid>.<entity>.<package_id>   one commit, msg id <package_id>:commit
 * ```
 * A package's batches are published as they come; nothing reads `b` subjects by
 * subscription, so they stay invisible. `commit` publishes one message on the `c` subject
 * with the meta, the totals and the batches' stream sequences, and that message is what the
 * one durable pull consumer (filtered on `<stream>.c.>`; a work-queue stream allows no
 * overlapping consumers) hands out. The handler reads the batches by sequence (direct get,
 * falling back to the leader). Success: the commit is acked (which removes it), then the batches are
 * deleted; a crash in between leaves batches without a commit, which the sweep removes.
 * Failure: nak with a growing delay. `pending(uuid)` counts the session's commit messages
 * still in the stream (the one in a handler included); `purge(uuid)` and `abort` delete the
 * matching messages one by one (see `#deleteMatching` for why not a filtered purge).
 *
 * Orphans: batches of a package whose gateway died before commit or abort. Every instance
 * sweeps now and then: a `b` subject with no `c` subject whose newest batch is older than
 * `orphanAfterMs` (far beyond the longest request) is deleted up to that batch. Committed
 * packages never expire unless `maxAgeMs` says so.
 *
 * Client ids are hex-encoded in subjects; other ids are used as they are when they are
 * `[A-Za-z0-9_-]+`, else hex-encoded behind a `=` (which plain tokens never contain).
 * Package ids must be unique (they are random UUIDs): the message ids dedupe on them.
 */
export class NatsBatchQueue implements BatchQueue {
  readonly #ctx: NatsContext;
  readonly #stream: string;
  readonly #durable: string;
  readonly #retryMs: number;
  readonly #delayMs: number;
  readonly #ackWaitMs: number;
  readonly #pullExpiresMs: number;
  readonly #orphanAfterMs: number;
  readonly #readAhead: number;
  readonly #maxAckPending: number;
  readonly #onError: (err: unknown, what: string) => void;
  readonly #writers = new Set<NatsWriter>();
  readonly #consumers = new Set<QueueConsumer>();
  #sweeper: NodeJS.Timeout | undefined;
  #closed = false;

  private constructor(ctx: NatsContext, opts: NatsBatchQueueOptions) {
    this.#ctx = ctx;
    this.#stream = opts.stream;
    this.#durable = opts.durable;
    this.#retryMs = opts.retryMs ?? 10_000;
    this.#delayMs = opts.redeliveryDelayMs ?? 1000;
    this.#ackWaitMs = opts.ackWaitMs ?? 300_000;
    this.#pullExpiresMs = Math.max(1000, opts.pullExpiresMs ?? 10_000);
    this.#orphanAfterMs = opts.orphanAfterMs ?? 3_600_000;
    this.#readAhead = Math.max(0, opts.readAhead ?? 3);
    this.#maxAckPending = opts.maxAckPending ?? 1000;
    this.#onError = opts.onError ?? (() => {});
  }

  static async open(ctx: NatsContext, opts: NatsBatchQueueOptions): Promise<NatsBatchQueue> {
    if (!NAME.test(opts.stream)) throw new Error(`Invalid stream name ${JSON.stringify(opts.stream)}: allowed are [A-Za-z0-9_-]+`);
    if (!NAME.test(opts.durable)) throw new Error(`Invalid consumer name ${JSON.stringify(opts.durable)}: allowed are [A-Za-z0-9_-]+`);
    if (!Number.isInteger(opts.replicas) || opts.replicas < 1) throw new Error(`Invalid replicas ${opts.replicas} for stream ${opts.stream}`);
    const q = new NatsBatchQueue(ctx, opts);
    await q.#ensureStream(opts);
    await q.#ensureConsumer();
    const every = opts.sweepIntervalMs ?? 600_000;
    if (every > 0) {
      q.#sweeper = setInterval(() => {
        q.sweep().catch((err: unknown) => q.#onError(err, 'sweep orphaned batches'));
      }, every);
      q.#sweeper.unref();
    }
    return q;
  }

  async open(meta: PackageMeta): Promise<PackageWriter> {
    this.#check();
    const copy: PackageMeta = {
      package_id: meta.package_id,
      client_id: meta.client_id,
      upload_uuid: meta.upload_uuid,
      entity: meta.entity,
      columns: [...meta.columns],
    };
    const tail = packageTail(copy);
    const writer: NatsWriter = new NatsWriter(copy, {
      append: async (batch, n) => (await this.#publish(`${this.#stream}.b.${tail}`, batch, `${copy.package_id}:${n}`)).seq,
      commit: async (rec, inline) => {
        const subject = `${this.#stream}.c.${tail}`;
        if (!inline) await this.#publish(subject, Buffer.from(JSON.stringify(rec)), `${copy.package_id}:commit`);
        else await this.#publish(subject, inline, `${copy.package_id}:commit`, () => inlineCommitHeaders(rec));
      },
      remove: () => this.#deleteMatching(`${this.#stream}.*.${tail}`),
      forget: () => this.#writers.delete(writer),
    });
    this.#writers.add(writer);
    return writer;
  }

  consume(handler: (pkg: CommittedPackage) => Promise<void>): QueueConsumer {
    this.#check();
    const puller = new Puller(this.#ctx, this.#stream, this.#durable, this.#pullExpiresMs);
    const loop = this.#run(puller, handler);
    let stopping: Promise<void> | undefined;
    const consumer: QueueConsumer = {
      stop: () =>
        (stopping ??= (async () => {
          puller.stop();
          await loop;
          this.#consumers.delete(consumer);
        })()),
    };
    this.#consumers.add(consumer);
    return consumer;
  }

  async pending(uploadUuid: string): Promise<number> {
    this.#check();
    const counts = await this.#subjects(`${this.#stream}.c.*.${token(uploadUuid)}.>`);
    let n = 0;
    for (const count of counts.values()) n += count;
    return n;
  }

  /**
   * From the consumer's counters (not yet delivered + delivered and not acked: the commits
   * still in the stream), and the first commit message after its ack floor. One attempt
   * each, bounded by the request timeout: a scrape should not wait out a NATS outage.
   */
  async backlog(): Promise<QueueBacklog> {
    this.#check();
    const info = await this.#ctx.jsm.consumers.info(this.#stream, this.#durable);
    const packages = info.num_pending + info.num_ack_pending;
    if (packages === 0) return { packages, oldestAgeMs: null };
    let oldest: StoredMsg | null = null;
    try {
      oldest = await this.#ctx.jsm.streams.getMessage(this.#stream, {
        seq: info.ack_floor.stream_seq + 1,
        next_by_subj: `${this.#stream}.c.>`,
      } as MsgRequest);
    } catch (err) {
      if (jsErrorCode(err) !== JS_NO_MESSAGE_FOUND) throw err;
    }
    return { packages, oldestAgeMs: oldest ? Math.max(0, Date.now() - oldest.time.getTime()) : null };
  }

  async purge(uploadUuid: string): Promise<void> {
    this.#check();
    for (const w of this.#writers) if (w.meta.upload_uuid === uploadUuid) w.drop();
    await this.#deleteMatching(`${this.#stream}.*.*.${token(uploadUuid)}.>`);
  }

  /**
   * Removes orphaned batches: packages with batches but no commit whose newest batch is older
   * than `orphanAfterMs`. Returns how many packages it removed. Safe to run anywhere, any time.
   */
  async sweep(now = Date.now()): Promise<number> {
    this.#check();
    const batches = await this.#subjects(`${this.#stream}.b.>`);
    if (batches.size === 0) return 0;
    const commits = await this.#subjects(`${this.#stream}.c.>`);
    const b = `${this.#stream}.b.`;
    const c = `${this.#stream}.c.`;
    let removed = 0;
    for (const subject of batches.keys()) {
      if (commits.has(c + subject.slice(b.length))) continue;
      const last = await this.#lastOf(subject);
      if (!last || now - last.time.getTime() < this.#orphanAfterMs) continue;
      // Up to the batch we looked at only: whatever came after it is not ours to judge.
      await this.#deleteMatching(subject, last.seq);
      removed++;
    }
    return removed;
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#sweeper);
    await Promise.all([...this.#consumers].map((c) => c.stop()));
    await Promise.allSettled([...this.#writers].map((w) => w.abort()));
  }

  async #run(puller: Puller, handler: (pkg: CommittedPackage) => Promise<void>): Promise<void> {
    try {
      for (;;) {
        const msg = await puller.next();
        if (msg === null) break;
        if (msg === 'retry') {
          // The consumer went away (deleted, not yet created on a new leader): make sure it exists, then ask again.
          await this.#ensureConsumer().catch((err: unknown) => this.#onError(err, 'recreate the queue consumer'));
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
    const info = parseAckSubject(msg.reply ?? '');
    let rec: CommitRecord;
    /** The package's only batch, when the commit message carries it. */
    let inline: Uint8Array | null = null;
    try {
      const header = msg.headers?.get(INLINE_COMMIT);
      if (header) {
        rec = parseCommit(Buffer.from(header, 'base64url'));
        inline = msg.data;
      } else {
        rec = parseCommit(msg.data);
      }
    } catch (err) {
      this.#onError(err, `drop unreadable commit message ${msg.subject}`);
      await this.#ack(msg);
      return;
    }
    const batchSubject = `${this.#stream}.b.${msg.subject.slice(this.#stream.length + 3)}`;
    let lost: Error | undefined;
    const heartbeat = setInterval(() => respond(msg, WPI), Math.max(100, Math.min(this.#ackWaitMs / 3, 30_000)));
    heartbeat.unref(); // the handler's own work keeps the process alive, not its heartbeat
    let ok = false;
    try {
      await handler({
        meta: rec.meta,
        rows: rec.rows,
        bytes: rec.bytes,
        attempt: info.delivered,
        batches: () =>
          inline
            ? (async function* () {
                yield inline;
              })()
            : this.#read(rec.batches, batchSubject, (err) => {
                lost = err;
              }),
      });
      ok = true;
    } catch {
      // A throwing handler is the redelivery signal; reporting is the handler's business.
    } finally {
      clearInterval(heartbeat);
    }
    if (ok) {
      if (await this.#ack(msg)) await this.#deleteSeqs(rec.batches).catch((err: unknown) => this.#onError(err, 'delete the batches of an uploaded package'));
      return;
    }
    if (lost) {
      // Redelivery cannot bring batches back: drop the package (ack removes it) and say so, unless a purge already took it.
      const stillThere = await this.#exists(info.streamSeq).catch(() => true);
      if (stillThere) this.#onError(lost, `drop package ${rec.meta.package_id} of session ${rec.meta.upload_uuid}: its batches are gone`);
      if (await this.#ack(msg)) await this.#deleteMatching(batchSubject).catch(() => {});
      return;
    }
    const delay = Math.min(this.#delayMs * 2 ** (info.delivered - 1), Math.max(this.#delayMs, MAX_DELAY_MS));
    respond(msg, Buffer.from(`-NAK ${JSON.stringify({ delay: nanos(delay) })}`));
  }

  async *#read(seqs: number[], subject: string, onLost: (err: Error) => void): AsyncIterable<Uint8Array> {
    const ahead: Promise<Uint8Array>[] = [];
    const fetch = (seq: number): Promise<Uint8Array> => {
      const p = this.#batch(seq, subject).catch((err: unknown) => {
        if (err instanceof LostBatchError) onLost(err);
        throw err;
      });
      p.catch(() => {}); // awaited below, or abandoned with the reader
      return p;
    };
    let next = 0;
    for (let i = 0; i < seqs.length; i++) {
      while (next < seqs.length && next <= i + this.#readAhead) ahead.push(fetch(seqs[next++]!));
      yield await ahead.shift()!;
    }
  }

  /**
   * Direct get (raw bytes, any replica: about five times the throughput of STREAM.MSG.GET
   * with its base64 JSON); whatever it cannot answer, a lagging replica perhaps, the leader does.
   */
  async #batch(seq: number, subject: string): Promise<Uint8Array> {
    const sm = (await this.#direct(seq)) ?? (await this.#getMessage({ seq }));
    if (!sm) throw new LostBatchError(`Batch ${seq} of ${subject} is gone`);
    if (sm.subject !== subject) throw new LostBatchError(`Batch ${seq} is not on ${subject}`);
    return sm.data;
  }

  /** `$JS.API.DIRECT.GET` by sequence; null for anything but a message (not there, no answer, not enabled). */
  async #direct(seq: number): Promise<{ subject: string; data: Uint8Array } | null> {
    try {
      const r = await this.#ctx.nc.request(`$JS.API.DIRECT.GET.${this.#stream}`, Buffer.from(JSON.stringify({ seq })), {
        timeout: this.#ctx.requestTimeoutMs,
      });
      const subject = r.headers?.get(DirectMsgHeaders.Subject);
      return subject && (r.headers?.code ?? 0) < 300 ? { subject, data: r.data } : null;
    } catch {
      return null;
    }
  }

  /** Acks and waits for the server to confirm; false (reported) when it never did. */
  async #ack(msg: Msg): Promise<boolean> {
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        await this.#ctx.nc.request(msg.reply!, ACK, { timeout: this.#ctx.requestTimeoutMs });
        return true;
      } catch (err) {
        if (attempt === 2 || this.#ctx.nc.isClosed()) {
          this.#onError(err, `ack ${msg.subject} (it will be delivered again)`);
          return false;
        }
      }
    }
    return false;
  }

  async #exists(seq: number): Promise<boolean> {
    return (await this.#getMessage({ seq })) !== null;
  }

  #publish(subject: string, data: Uint8Array, msgID: string, hdrs?: () => MsgHdrs) {
    return publishOnce(this.#ctx, subject, data, { msgID, stream: this.#stream, budgetMs: this.#retryMs, ...(hdrs ? { headers: hdrs } : {}) });
  }

  /**
   * Deletes every message on subjects matching `filter` (up to `upToSeq`), found one by one
   * with `next_by_subj`. Never a filtered purge: on nats-server 2.9 a filtered purge moves the
   * work-queue consumer past every message still queued, of any subject.
   */
  async #deleteMatching(filter: string, upToSeq = Number.MAX_SAFE_INTEGER): Promise<void> {
    let from = 1;
    for (;;) {
      const found: number[] = [];
      while (found.length < 64) {
        const sm = await this.#getMessage({ seq: from, next_by_subj: filter });
        if (!sm || sm.seq > upToSeq) break;
        found.push(sm.seq);
        from = sm.seq + 1;
      }
      await this.#deleteSeqs(found);
      if (found.length < 64) return;
    }
  }

  /** Deletes these messages, a few requests at a time; one already gone is fine. */
  async #deleteSeqs(seqs: number[]): Promise<void> {
    const left = [...seqs];
    const worker = async (): Promise<void> => {
      for (let seq = left.shift(); seq !== undefined; seq = left.shift()) {
        const s = seq;
        try {
          await withRetry(this.#ctx, this.#retryMs, () => this.#ctx.jsm.streams.deleteMessage(this.#stream, s, false));
        } catch (err) {
          if (jsErrorCode(err) !== JS_DELETE_FAILED) throw err;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(8, left.length) }, worker));
  }

  /** A stored message, or null when there is none (STREAM.MSG.GET, answered by the leader). */
  async #getMessage(query: { seq: number } | { last_by_subj: string } | { seq: number; next_by_subj: string }): Promise<StoredMsg | null> {
    try {
      // nats.js types `next_by_subj` for direct get only; the server takes it on STREAM.MSG.GET too (2.9+).
      return await withRetry(this.#ctx, this.#retryMs, () => this.#ctx.jsm.streams.getMessage(this.#stream, query as MsgRequest));
    } catch (err) {
      if (jsErrorCode(err) === JS_NO_MESSAGE_FOUND) return null;
      throw err;
    }
  }

  /** Message count per subject matching `filter`, from the stream's own state. */
  async #subjects(filter: string): Promise<Map<string, number>> {
    const info = await withRetry(this.#ctx, this.#retryMs, () => this.#ctx.jsm.streams.info(this.#stream, { subjects_filter: filter }));
    return new Map(Object.entries(info.state.subjects ?? {}));
  }

  async #lastOf(subject: string): Promise<{ seq: number; time: Date } | null> {
    const sm = await this.#getMessage({ last_by_subj: subject });
    return sm && { seq: sm.seq, time: sm.time };
  }

  async #ensureStream(opts: NatsBatchQueueOptions): Promise<void> {
    const { jsm } = this.#ctx;
    const want = {
      subjects: [`${this.#stream}.b.>`, `${this.#stream}.c.>`],
      num_replicas: opts.replicas,
      max_age: nanos(opts.maxAgeMs ?? 0),
      max_bytes: opts.maxBytes ?? -1,
      allow_direct: true,
    };
    let config: StreamConfig;
    try {
      config = (await withRetry(this.#ctx, this.#retryMs, () => jsm.streams.info(this.#stream))).config;
    } catch (err) {
      if (jsErrorCode(err) !== JS_STREAM_NOT_FOUND) throw err;
      try {
        await withRetry(this.#ctx, this.#retryMs, () =>
          jsm.streams.add({
            name: this.#stream,
            ...want,
            retention: RetentionPolicy.Workqueue,
            storage: StorageType.File,
            // Never drop queued data to make room: a full stream refuses new appends instead.
            discard: DiscardPolicy.New,
            duplicate_window: nanos(120_000),
          }),
        );
        return;
      } catch (addErr) {
        // Another process created it first: check that one instead.
        if (jsErrorCode(addErr) !== JS_STREAM_NAME_IN_USE) throw addErr;
        config = (await withRetry(this.#ctx, this.#retryMs, () => jsm.streams.info(this.#stream))).config;
      }
    }
    if (config.retention !== RetentionPolicy.Workqueue || config.storage !== StorageType.File) {
      throw new Error(`Stream ${this.#stream} exists with ${config.retention} retention and ${config.storage} storage; the batch queue needs workqueue and file`);
    }
    const same =
      config.num_replicas === want.num_replicas &&
      config.max_age === want.max_age &&
      config.max_bytes === want.max_bytes &&
      config.allow_direct === want.allow_direct &&
      want.subjects.every((s) => config.subjects?.includes(s));
    if (!same) {
      const subjects = [...new Set([...(config.subjects ?? []), ...want.subjects])];
      await withRetry(this.#ctx, this.#retryMs, () => jsm.streams.update(this.#stream, { ...config, ...want, subjects }));
    }
  }

  async #ensureConsumer(): Promise<void> {
    const { jsm } = this.#ctx;
    const want: Partial<ConsumerConfig> = {
      durable_name: this.#durable,
      filter_subject: `${this.#stream}.c.>`,
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(this.#ackWaitMs),
      deliver_policy: DeliverPolicy.All,
      replay_policy: ReplayPolicy.Instant,
      max_deliver: -1,
      max_ack_pending: this.#maxAckPending,
    };
    try {
      const { config } = await withRetry(this.#ctx, this.#retryMs, () => jsm.consumers.info(this.#stream, this.#durable));
      if (config.ack_wait !== want.ack_wait || config.max_ack_pending !== want.max_ack_pending) {
        await withRetry(this.#ctx, this.#retryMs, () =>
          jsm.consumers.update(this.#stream, this.#durable, { ack_wait: want.ack_wait!, max_ack_pending: this.#maxAckPending }),
        );
      }
    } catch (err) {
      if (jsErrorCode(err) !== JS_CONSUMER_NOT_FOUND) throw err;
      // Creating a durable with the same config is idempotent, so racing processes agree.
      await withRetry(this.#ctx, this.#retryMs, () => jsm.consumers.add(this.#stream, want));
    }
  }

  #check(): void {
    if (this.#closed) throw new Error('Batch queue is closed');
  }
}

const ACK = Buffer.from('+ACK');
const WPI = Buffer.from('+WPI');

class LostBatchError extends Error {
  override readonly name = 'LostBatchError';
  readonly code = 'QUEUE_BATCH_LOST';
}

interface WriterHooks {
  /** Publishes batch number `n`; resolves with its stream sequence. */
  append(batch: Uint8Array, n: number): Promise<number>;
  /** Publishes the commit; `inline` is the package's only batch, carried in the commit message itself. */
  commit(rec: CommitRecord, inline?: Uint8Array): Promise<void>;
  /** Purges whatever the package has in the stream, batches and commit. */
  remove(): Promise<void>;
  forget(): void;
}

class NatsWriter implements PackageWriter {
  readonly meta: PackageMeta;
  readonly #hooks: WriterHooks;
  readonly #seqs: number[] = [];
  /**
   * The last batch appended, not yet published: if the package ends with no other, it goes
   * inside the commit message (one publish, one round trip, for a small package).
   */
  #held: Uint8Array | null = null;
  /** Appends run one after another, in call order, even when the caller does not await. */
  #tail: Promise<void> = Promise.resolve();
  #done = false;
  /** Purged or aborted: whatever the writer does next, the package must not be seen. */
  #dropped = false;

  constructor(meta: PackageMeta, hooks: WriterHooks) {
    this.meta = meta;
    this.#hooks = hooks;
  }

  append(batch: Uint8Array): Promise<void> {
    const run = this.#tail.then(async () => {
      this.#live();
      await this.#publishHeld();
      // A small batch may travel with the commit: kept as a copy (the caller may reuse its memory once this resolves).
      if (batch.byteLength <= INLINE_BATCH_BYTES) this.#held = Uint8Array.prototype.slice.call(batch);
      else this.#seqs.push(await this.#hooks.append(batch, this.#seqs.length));
    });
    this.#tail = run.catch(() => {});
    return run;
  }

  async commit(totals: { rows: number; bytes: number }): Promise<void> {
    await this.#tail;
    this.#live();
    this.#done = true;
    try {
      const inline = this.#seqs.length === 0 ? this.#held : null;
      if (!inline) await this.#publishHeld();
      await this.#hooks.commit({ meta: this.meta, rows: totals.rows, bytes: totals.bytes, batches: [...this.#seqs] }, inline ?? undefined);
      if (this.#dropped) throw new Error(`Package ${this.meta.package_id} was purged before its commit completed`);
    } catch (err) {
      // Not committed as far as the caller knows, so it must not be delivered either.
      await this.#hooks.remove().catch(() => {});
      throw err;
    } finally {
      this.#held = null;
      this.#hooks.forget();
    }
  }

  async abort(): Promise<void> {
    this.#done = true;
    this.drop();
    await this.#tail;
    this.#held = null;
    await this.#hooks.remove();
  }

  drop(): void {
    this.#dropped = true;
    this.#hooks.forget();
  }

  async #publishHeld(): Promise<void> {
    const held = this.#held;
    if (!held) return;
    this.#held = null;
    this.#seqs.push(await this.#hooks.append(held, this.#seqs.length));
  }

  #live(): void {
    if (this.#dropped) throw new Error(`Package ${this.meta.package_id} was purged or aborted`);
    if (this.#done) throw new Error(`Package ${this.meta.package_id} is already committed`);
  }
}

/**
 * Pull requests of one `consume` loop, one message at a time, on one inbox. `stop()` ends
 * the wait at once; `close()` drains the inbox, and a delivery that was already on its way
 * is nak'ed at once so another consumer takes it without waiting for the ack wait.
 */
class Puller {
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
    for (const msg of this.#ready.splice(0)) respond(msg, NAK_NOW);
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
        respond(msg, NAK_NOW);
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

/** Ack-protocol replies are fire-and-forget: a closed connection drops them, and the ack wait redelivers. */
function respond(msg: Msg, payload: Uint8Array): void {
  try {
    msg.respond(payload);
  } catch {
    // see above
  }
}

const NAK_NOW = Buffer.from('-NAK');

/** `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>...`, or with `<domain>.<account hash>` after `ACK` (v2). */
function parseAckSubject(reply: string): { delivered: number; streamSeq: number } {
  const t = reply.split('.');
  const at = t.length === 9 ? 4 : 6;
  const delivered = Number(t[at]);
  const streamSeq = Number(t[at + 1]);
  return { delivered: Number.isInteger(delivered) && delivered > 0 ? delivered : 1, streamSeq };
}

function parseCommit(data: Uint8Array): CommitRecord {
  const rec = JSON.parse(Buffer.from(data).toString('utf8')) as CommitRecord;
  const m = rec?.meta;
  if (
    !m ||
    typeof m.package_id !== 'string' ||
    typeof m.upload_uuid !== 'string' ||
    typeof m.client_id !== 'string' ||
    typeof m.entity !== 'string' ||
    !Array.isArray(m.columns) ||
    typeof rec.rows !== 'number' ||
    typeof rec.bytes !== 'number' ||
    !Array.isArray(rec.batches) ||
    !rec.batches.every((s) => Number.isInteger(s) && s > 0)
  ) {
    throw new Error('Commit message does not describe a package');
  }
  return rec;
}

/** `<client hex>.<upload_uuid>.<entity>.<package_id>`: the subject tail shared by a package's batches and commit. */
function packageTail(meta: PackageMeta): string {
  if (meta.client_id === '') throw new Error('Invalid client_id: empty');
  return `${Buffer.from(meta.client_id, 'utf8').toString('hex')}.${token(meta.upload_uuid)}.${token(meta.entity)}.${token(meta.package_id)}`;
}

function token(id: string): string {
  if (id === '') throw new Error('Invalid id: empty');
  return PLAIN_TOKEN.test(id) ? id : `=${Buffer.from(id, 'utf8').toString('hex')}`;
}

function inlineCommitHeaders(rec: CommitRecord): MsgHdrs {
  const h = headers();
  h.set(INLINE_COMMIT, Buffer.from(JSON.stringify(rec)).toString('base64url'));
  return h;
}
