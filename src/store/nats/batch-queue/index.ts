import { performance } from 'node:perf_hooks';
import {
  AckPolicy,
  DeliverPolicy,
  DiscardPolicy,
  nanos,
  ReplayPolicy,
  RetentionPolicy,
  StorageType,
  type ConsumerConfig,
  type MsgRequest,
  type StoredMsg,
  type StreamConfig,
} from 'nats';
import { StoreError, type BatchQueue, type CommittedPackage, type PackageMeta, type PackageWriter, type QueueBacklog, type QueueConsumer } from '../../ports.js';
import { answerSoon, enableStreamFeatures, JS_NO_MESSAGE_FOUND, JS_STREAM_NAME_IN_USE, JS_STREAM_NOT_FOUND, jsErrorCode, LastRead, withRetry, type NatsContext } from '../connection.js';
import { NatsConsumer } from './consumer.js';
import { StreamMessages } from './messages.js';
import { inlineCommitHeaders } from './record.js';
import { AckedRemover } from './remover.js';
import { NAME, packageTail, QueueSubjects, token } from './subjects.js';
import { sweepAcknowledged, sweepOrphans } from './sweeper.js';
import { GroupPublisher } from '../group-publisher.js';
import { NatsWriter } from './writer.js';

export interface NatsBatchQueueOptions {
  /** Stream name (`[A-Za-z0-9_-]+`); it is also the first token of every subject. */
  stream: string;
  /** Replicas of the stream (its consumer follows). Applied to an existing stream too. */
  replicas: number;
  /** The one durable pull consumer every `consume` of every process shares. */
  durable: string;
  /** First redelivery delay after a handler throws; doubles per attempt, capped at 30 s (default 1000). */
  redeliveryDelayMs?: number;
  /** Ack wait of the consumer (`nats.ackWaitMs`); heartbeats while a handler runs keep a slow upload its package. */
  ackWaitMs: number;
  /** How long one publish, read or delete keeps retrying through transient failures (default 10000). */
  retryMs?: number;
  /** Batches of a package with no commit and no append for this long belong to a dead writer (default 3600000). */
  orphanAfterMs?: number;
  /** How often this instance sweeps orphaned batches away (default 600000; 0: never, call `sweep()` yourself). */
  sweepIntervalMs?: number;
  /** How long an acknowledged commit waits for the bulk removal on a limits stream (default 100; remover.ts). */
  removeEveryMs?: number;
  /** Background failures: sweeps, acks, deletes after an ack, dropped packages. */
  onError?: (err: unknown, what: string) => void;
  /**
   * Told after each ack this process's consumers got confirmed, and after each bulk removal of
   * acked commits: what `pending` answers, this process's or (the removal) another's, may have changed.
   */
  onAcked?: () => void;
  /** Milliseconds, for the ack floor's age (default `performance.now`; tests drive their own). */
  clock?: () => number;
}

/** Packages handed out and not yet acked, over all consumers of all processes. */
const MAX_ACK_PENDING = 1000;
/** Expiry of one pull request; an idle consumer asks again after it. */
const PULL_EXPIRES_MS = 10_000;
/** Batches read ahead of the one the handler consumes: with the one in hand, 2 MiB of 512 KiB batches. */
const READ_AHEAD = 3;
/** How long `hasPending` reuses the consumer's ack floor it read. */
const ACK_FLOOR_REUSE_MS = 1000;
/** Sessions whose last `hasPending` answer is kept. */
const REMEMBERED_ANSWERS = 4096;

const JS_CONSUMER_NOT_FOUND = 10014;

/** Room left in a message for its headers (message id, expected stream): the rest of `max_payload` is the batch's. */
const HEADER_ROOM_BYTES = 4096;

/** The most bytes of a batch one message carries under the server's `max_payload` (nats.js refuses a larger publish outright). */
export function maxBatchBytes(maxPayload: number | undefined): number {
  return Math.max(HEADER_ROOM_BYTES, (maxPayload ?? 1024 * 1024) - HEADER_ROOM_BYTES);
}

/**
 * `BatchQueue` on one JetStream stream with limits retention (no limit set) and file storage.
 *
 * Subjects (subjects.ts): a package's batches on `<stream>.b.<tail>`, its commit on
 * `<stream>.c.<tail>`. The writer (writer.ts) publishes batches as they come; nothing reads
 * `b` subjects by subscription, so they stay invisible. `commit` publishes one message on the
 * `c` subject with the meta, the totals and the batches' stream sequences (record.ts), and
 * that message is what the one durable pull consumer (filtered on `<stream>.c.>`) hands out
 * (consumer.ts, puller.ts). The handler reads the batches by sequence (direct get, falling
 * back to the leader). Success: the commit is acked, then the batches are deleted; acked
 * commits leave the stream in bulk a moment later (remover.ts), and whatever a crash leaves
 * behind the sweep (sweeper.ts) removes. Failure: nak with a growing delay.
 *
 * The consumer's state says what is done, never the stream's contents: a commit at or below
 * its ack floor is acked and never handed out again, whatever the stream still holds.
 * `pending(uuid)` counts the session's commit messages above the floor that this process
 * has not acked (the one in a handler included); `purge(uuid)` and `abort` delete the
 * matching messages with a filtered purge.
 *
 * A stream made before this (work-queue retention: the server removes each message when it
 * is acked, one synced write per package) cannot change its retention in place; it keeps
 * working as it is (`retention`), without the bulk removal (docs/operations.md says how to
 * move to limits).
 *
 * Package ids must be unique (they are random UUIDs): the message ids dedupe on them.
 */
export class NatsBatchQueue implements BatchQueue {
  readonly #ctx: NatsContext;
  readonly #subjects: QueueSubjects;
  readonly #messages: StreamMessages;
  readonly #stream: string;
  readonly #durable: string;
  readonly #retryMs: number;
  readonly #delayMs: number;
  readonly #ackWaitMs: number;
  readonly #orphanAfterMs: number;
  readonly #onError: (err: unknown, what: string) => void;
  readonly #onAcked: (() => void) | undefined;
  readonly #clock: () => number;
  readonly #writers = new Set<NatsWriter>();
  readonly #consumers = new Set<QueueConsumer>();
  /** Commit messages of every package committed meanwhile go out together (group-publisher.ts). */
  #commits!: GroupPublisher;
  #sweeper: NodeJS.Timeout | undefined;
  /** The consumer's ack floor as last read (`#ackFloor`). */
  #floor: { at: number; seq: Promise<number> } | null = null;
  /** The ack floor as last read; null before the first read. */
  #knownFloor: number | null = null;
  /**
   * The highest ack floor read from the consumer as it is (its `created`; forgotten when a read
   * finds none). A consumer's floor never goes back, but a read of it can: around a partition's
   * heal a consumer leader deposed, or elected and not yet caught up, may answer a lower one
   * (the likeliest cause of a start-upload 409 seen once after status had said finished).
   * Pending is judged by this one; the sweep, which deletes, by the floor as read.
   */
  #highestFloor: { created: string; seq: number } | null = null;
  /** `hasPending` for an answer, as last found per session (the most recent `REMEMBERED_ANSWERS`). */
  readonly #lastPending = new LastRead<boolean>(REMEMBERED_ANSWERS);
  /** Removes acked commits in bulk; null on a work-queue stream, where each ack removes its commit. */
  #remover: AckedRemover | null = null;
  #retention: RetentionPolicy.Limits | RetentionPolicy.Workqueue = RetentionPolicy.Limits;
  #closed = false;

  private constructor(ctx: NatsContext, opts: NatsBatchQueueOptions) {
    this.#ctx = ctx;
    this.#stream = opts.stream;
    this.#subjects = new QueueSubjects(opts.stream);
    this.#durable = opts.durable;
    this.#retryMs = opts.retryMs ?? 10_000;
    this.#messages = new StreamMessages(ctx, opts.stream, this.#retryMs);
    this.#delayMs = opts.redeliveryDelayMs ?? 1000;
    this.#ackWaitMs = opts.ackWaitMs;
    this.#orphanAfterMs = opts.orphanAfterMs ?? 3_600_000;
    this.#onError = opts.onError ?? (() => {});
    this.#onAcked = opts.onAcked;
    this.#clock = opts.clock ?? (() => performance.now());
  }

  static async open(ctx: NatsContext, opts: NatsBatchQueueOptions): Promise<NatsBatchQueue> {
    if (!NAME.test(opts.stream)) throw new StoreError('STORE_MISCONFIGURED', `Invalid stream name ${JSON.stringify(opts.stream)}: allowed are [A-Za-z0-9_-]+`);
    if (!NAME.test(opts.durable)) throw new StoreError('STORE_MISCONFIGURED', `Invalid consumer name ${JSON.stringify(opts.durable)}: allowed are [A-Za-z0-9_-]+`);
    if (!Number.isInteger(opts.replicas) || opts.replicas < 1) throw new StoreError('STORE_MISCONFIGURED', `Invalid replicas ${opts.replicas} for stream ${opts.stream}`);
    const q = new NatsBatchQueue(ctx, opts);
    q.#retention = await q.#ensureStream(opts);
    await q.#ensureConsumer();
    if (q.#retention === RetentionPolicy.Limits) {
      q.#remover = new AckedRemover({
        messages: q.#messages,
        commits: q.#subjects.commits,
        readFloor: () => q.#readFloor(ctx.requestTimeoutMs),
        intervalMs: opts.removeEveryMs ?? 100,
        onError: q.#onError,
        onRemoved: () => q.#onAcked?.(),
      });
    }
    q.#commits = new GroupPublisher(ctx, opts.stream, { atomic: (await enableStreamFeatures(ctx, opts.stream, q.#retryMs)).atomic, budgetMs: q.#retryMs });
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
    const messages = this.#messages;
    const writer: NatsWriter = new NatsWriter(copy, {
      append: async (batch, n) => (await messages.publish(this.#subjects.batch(tail), batch, `${copy.package_id}:${n}`)).seq,
      maxBatchBytes: () => maxBatchBytes(this.#ctx.nc.info?.max_payload),
      commit: async (rec, inline) =>
        void (await this.#commits.publish({
          subject: this.#subjects.commit(tail),
          data: inline?.batch ?? Buffer.from(JSON.stringify(rec)),
          msgID: `${copy.package_id}:commit`,
          ...(inline ? { headers: () => inlineCommitHeaders(inline.header) } : {}),
        })),
      remove: () => messages.deleteMatching(this.#subjects.package(tail)),
      forget: () => this.#writers.delete(writer),
    });
    this.#writers.add(writer);
    return writer;
  }

  /** The stream's retention: limits, or work queue for a stream made before the bulk removal. */
  get retention(): RetentionPolicy.Limits | RetentionPolicy.Workqueue {
    return this.#retention;
  }

  /** How the commit messages went out: atomic batches and the messages in them, single publishes. */
  get commitStats(): GroupPublisher['stats'] {
    return this.#commits.stats;
  }

  consume(handler: (pkg: CommittedPackage) => Promise<void>): QueueConsumer {
    this.#check();
    const consumer: NatsConsumer = new NatsConsumer(
      {
        messages: this.#messages,
        subjects: this.#subjects,
        durable: this.#durable,
        redeliveryDelayMs: this.#delayMs,
        ackWaitMs: this.#ackWaitMs,
        pullExpiresMs: PULL_EXPIRES_MS,
        readAhead: READ_AHEAD,
        ensureConsumer: () => this.#ensureConsumer(),
        acked: (seq) => {
          this.#remover?.acked(seq);
          this.#onAcked?.();
        },
        settle: async () => this.#remover?.finish(),
        onError: this.#onError,
      },
      handler,
      () => this.#consumers.delete(consumer),
    );
    this.#consumers.add(consumer);
    return consumer;
  }

  /** The session's commit messages above the consumer's ack floor, one lookup each (tests and tools; status asks `hasPending`). */
  async pending(uploadUuid: string): Promise<number> {
    this.#check();
    const filter = this.#subjects.sessionCommits(uploadUuid);
    let n = 0;
    for (let sm = await this.#messages.get({ seq: (await this.#ackFloor()) + 1, next_by_subj: filter }); sm; sm = await this.#messages.get({ seq: sm.seq + 1, next_by_subj: filter })) {
      if (!this.#remover?.has(sm.seq)) n++;
    }
    return n;
  }

  /**
   * Whether any of the session's commit messages above the consumer's ack floor is not acked:
   * usually two lookups (the floor is shared by the calls of about a second, and refreshed by
   * every round of the bulk removal). Not every commit message in the stream: one at or below
   * the floor is acknowledged, whatever the stream still holds (on a limits stream until the
   * next bulk removal; on a work queue, which removes a message when it is acked, after a
   * power cut between the two: 68 of them once held three sessions' `upload_tasks_finished`
   * false for good), and no consumer will ever deliver it again. Above the floor, the commits
   * this process acked and has not removed yet are skipped; another process's are removed
   * within a round or two of their ack.
   */
  async hasPending(uploadUuid: string, opts: { forAnswer?: boolean; stored?: (packageId: string) => Promise<boolean> } = {}): Promise<boolean> {
    this.#check();
    if (!opts.forAnswer) return this.#hasPending(uploadUuid, opts.stored);
    // For an answer: while no replica answers (a leader being elected) the last answer serves.
    const fresh = this.#answerPending(uploadUuid).then((pending) => {
      this.#lastPending.set(uploadUuid, pending);
      return pending;
    });
    return answerSoon(fresh, () => this.#lastPending.recent(uploadUuid));
  }

  /** For a decision: the floor read fresh, the stream from its leader. */
  async #hasPending(uploadUuid: string, stored?: (packageId: string) => Promise<boolean>): Promise<boolean> {
    const filter = this.#subjects.sessionCommits(uploadUuid);
    const get = (seq: number) => this.#messages.get({ seq, next_by_subj: filter });
    for (let sm = await get(this.#highest(await this.#ackFloor()) + 1); sm; sm = await get(sm.seq + 1)) {
      if (this.#remover?.has(sm.seq)) continue;
      // The floor read can still be below the acks ("consumer not found" reads as 0; a lower
      // one from a process that never read the higher): the ledger's marker settles it.
      if (!stored || !(await stored(this.#subjects.packageIdOf(sm.subject)))) return true;
    }
    return false;
  }

  /** For an answer: the last floor read, the stream from any replica. */
  async #answerPending(uploadUuid: string): Promise<boolean> {
    const filter = this.#subjects.sessionCommits(uploadUuid);
    const get = (seq: number) => this.#messages.getForAnswer({ seq, next_by_subj: filter });
    for (let sm = await get(this.#highest(await this.#lastFloor()) + 1); sm; sm = await get(sm.seq + 1)) {
      if (!this.#remover?.has(sm.seq)) return true;
    }
    return false;
  }

  /**
   * The ack floor for an answer: the last floor read, at once; when it is older than
   * `ACK_FLOOR_REUSE_MS` a fresh read starts for the answers after this one. An answer never
   * waits for the consumer's info, which queues behind the server's other API requests (under
   * load its p99 was the status's). Lower than the real one, the floor only counts as pending
   * what was acknowledged meanwhile and not yet removed from the stream: this process's acks
   * are skipped anyway, another process's show for one more answer.
   */
  async #lastFloor(): Promise<number> {
    const known = this.#knownFloor;
    if (known === null) return this.#ackFloor();
    this.#ackFloor().catch(() => {}); // a failed read is the next answer's to retry
    return known;
  }

  /**
   * The stream sequence of the consumer's ack floor: every commit message at or below it is
   * acknowledged. Read at most once every `ACK_FLOOR_REUSE_MS` and shared: the floor only
   * moves up, so one a little old only counts a package acknowledged meanwhile as pending, which
   * the stream has usually removed anyway. No consumer (deleted, not yet made again): 0, all pending.
   */
  #ackFloor(): Promise<number> {
    const cached = this.#floor;
    if (cached && this.#clock() - cached.at < ACK_FLOOR_REUSE_MS) return cached.seq;
    return this.#readFloor(this.#retryMs);
  }

  /** Reads the ack floor now (through transient failures for `retryMs`) and shares it with `#ackFloor`. */
  #readFloor(retryMs: number): Promise<number> {
    const at = this.#clock();
    const seq = withRetry(this.#ctx, retryMs, () => this.#ctx.jsm.consumers.info(this.#stream, this.#durable)).then(
      (info) => {
        const read = info.ack_floor.stream_seq;
        const high = this.#highestFloor;
        if (!high || high.created !== info.created || high.seq < read) this.#highestFloor = { created: info.created, seq: read };
        return (this.#knownFloor = read);
      },
      (err: unknown) => {
        if (this.#floor?.seq === seq) this.#floor = null;
        if (jsErrorCode(err) !== JS_CONSUMER_NOT_FOUND) throw err;
        this.#highestFloor = null;
        return 0;
      },
    );
    this.#floor = { at, seq };
    return seq;
  }

  /** `read`, or the highest floor read from the same consumer if that is higher (see `#highestFloor`). */
  #highest(read: number): number {
    return Math.max(read, this.#highestFloor?.seq ?? 0);
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
        next_by_subj: this.#subjects.commits,
      } as MsgRequest);
    } catch (err) {
      if (jsErrorCode(err) !== JS_NO_MESSAGE_FOUND) throw err;
    }
    return { packages, oldestAgeMs: oldest ? Math.max(0, Date.now() - oldest.time.getTime()) : null };
  }

  async purge(uploadUuid: string): Promise<void> {
    this.#check();
    for (const w of this.#writers) if (w.meta.upload_uuid === uploadUuid) w.drop();
    await this.#messages.deleteMatching(this.#subjects.session(uploadUuid));
  }

  /**
   * Removes what no consumer will take (sweeper.ts): packages acknowledged but still in the
   * stream (their commit at or below the consumer's ack floor), then orphaned batches
   * (packages with batches but no commit whose newest batch is older than `orphanAfterMs`).
   * Returns how many packages it removed. Safe to run anywhere, any time.
   */
  async sweep(now = Date.now()): Promise<number> {
    this.#check();
    this.#floor = null;
    const acked = await sweepAcknowledged(this.#messages, this.#subjects, await this.#ackFloor());
    // On a limits stream acked commits wait for the bulk removal: one a process did not live to remove is no damage.
    if (acked > 0 && this.#retention === RetentionPolicy.Workqueue) {
      this.#onError(new StoreError('STORE_CORRUPT', `${acked} acknowledged packages were still in stream ${this.#stream}`), 'remove acknowledged packages left in the stream (a server that lost power after an ack)');
    }
    return acked + (await sweepOrphans(this.#messages, this.#subjects, this.#orphanAfterMs, now));
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#sweeper);
    await Promise.all([...this.#consumers].map((c) => c.stop()));
    this.#remover?.close();
    await Promise.allSettled([...this.#writers].map((w) => w.abort()));
  }

  /** Makes the stream, or checks and updates the one there; resolves with its retention. */
  async #ensureStream(opts: NatsBatchQueueOptions): Promise<RetentionPolicy.Limits | RetentionPolicy.Workqueue> {
    const { jsm } = this.#ctx;
    const want = {
      subjects: this.#subjects.all,
      num_replicas: opts.replicas,
      // No age or size limit: a committed package stays until an uploader took it; orphans are swept.
      max_age: 0,
      max_bytes: -1,
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
            // Not a work queue: acked commits are removed in bulk (remover.ts), not one synced write per ack.
            retention: RetentionPolicy.Limits,
            storage: StorageType.File,
            // Never drop queued data to make room: a full stream refuses new appends instead.
            discard: DiscardPolicy.New,
            duplicate_window: nanos(120_000),
          }),
        );
        return RetentionPolicy.Limits;
      } catch (addErr) {
        // Another process created it first: check that one instead.
        if (jsErrorCode(addErr) !== JS_STREAM_NAME_IN_USE) throw addErr;
        config = (await withRetry(this.#ctx, this.#retryMs, () => jsm.streams.info(this.#stream))).config;
      }
    }
    const retention = config.retention;
    if ((retention !== RetentionPolicy.Limits && retention !== RetentionPolicy.Workqueue) || config.storage !== StorageType.File) {
      throw new StoreError('STORE_MISCONFIGURED', `Stream ${this.#stream} exists with ${config.retention} retention and ${config.storage} storage; the batch queue needs limits (or workqueue) and file`);
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
    return retention;
  }

  async #ensureConsumer(): Promise<void> {
    const { jsm } = this.#ctx;
    const want: Partial<ConsumerConfig> = {
      durable_name: this.#durable,
      filter_subject: this.#subjects.commits,
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(this.#ackWaitMs),
      deliver_policy: DeliverPolicy.All,
      replay_policy: ReplayPolicy.Instant,
      max_deliver: -1,
      max_ack_pending: MAX_ACK_PENDING,
    };
    try {
      const { config } = await withRetry(this.#ctx, this.#retryMs, () => jsm.consumers.info(this.#stream, this.#durable));
      if (config.ack_wait !== want.ack_wait || config.max_ack_pending !== want.max_ack_pending) {
        await withRetry(this.#ctx, this.#retryMs, () =>
          jsm.consumers.update(this.#stream, this.#durable, { ack_wait: want.ack_wait!, max_ack_pending: MAX_ACK_PENDING }),
        );
      }
    } catch (err) {
      if (jsErrorCode(err) !== JS_CONSUMER_NOT_FOUND) throw err;
      // Creating a durable with the same config is idempotent, so racing processes agree.
      await withRetry(this.#ctx, this.#retryMs, () => jsm.consumers.add(this.#stream, want));
    }
  }

  #check(): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Batch queue is closed');
  }
}
