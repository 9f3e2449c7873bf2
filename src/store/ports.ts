/**
 * The three ports the domain talks to. Each has an embedded (file-backed) adapter and a
 * distributed one (NATS JetStream KV / JetStream stream / S3); both pass the same contract
 * suites in test/contract/. Nothing above these interfaces knows which adapter it runs on.
 */
import type { InternalErrorCode } from '../errors.js';

/** A value together with the revision that a compare-and-set must name. */
export interface Versioned<T> {
  value: T;
  revision: number;
}

/**
 * Codes of the errors the stores throw (`StoreError.code`). Callers match on the code, never on
 * the message.
 * - `STORE_CLOSED`: the store (or queue, ledger, file) was closed; nothing more goes through it.
 * - `STORE_CONFLICT`: `create` found the key there, or `update`/`delete` named a stale
 *   revision. Callers re-read and retry (or answer) on it.
 * - `STORE_INVALID_KEY`: a key, id or object key the store cannot take (a caller's bug).
 * - `STORE_MISCONFIGURED`: options, or what exists under the configured names (a stream of
 *   the wrong kind, a missing bucket), that the store cannot work with; at open.
 * - `STORE_UNAVAILABLE`: the backing system does not answer or refuses for now (NATS down,
 *   object storage unusable, objects it would not delete); worth another try later.
 * - `STORE_CORRUPT`: stored bytes are not what the store wrote (a file shorter than its
 *   index says, a commit message that describes no package).
 * - `QUEUE_PACKAGE_DROPPED`: the package being written was purged (its session deleted) or
 *   aborted, so it is never delivered; or, from a delivery's batches, it was purged after it
 *   was taken.
 * - `QUEUE_PACKAGE_COMMITTED`: the package was already committed; no more appends.
 * - `QUEUE_BATCH_LOST`: a committed package's batches are gone; redelivery cannot help.
 */
export const STORE_ERROR_CODES = [
  'STORE_CLOSED',
  'STORE_CONFLICT',
  'STORE_INVALID_KEY',
  'STORE_MISCONFIGURED',
  'STORE_UNAVAILABLE',
  'STORE_CORRUPT',
  'QUEUE_PACKAGE_DROPPED',
  'QUEUE_PACKAGE_COMMITTED',
  'QUEUE_BATCH_LOST',
] as const satisfies readonly InternalErrorCode[];

export type StoreErrorCode = (typeof STORE_ERROR_CODES)[number];

export class StoreError extends Error {
  override readonly name: string = 'StoreError';
  readonly code: StoreErrorCode;
  /**
   * A write that failed with nothing of it stored, for sure: the store refused it (JetStream
   * out of storage, with no earlier attempt in doubt), or rolled it back for good. Otherwise a
   * failed write's outcome is unknown (a timeout: it may still land).
   */
  readonly notWritten: boolean;
  constructor(code: StoreErrorCode, message: string, options?: { cause?: unknown; notWritten?: boolean }) {
    super(message, options);
    this.code = code;
    this.notWritten = options?.notWritten ?? false;
  }
}

/** A write's failure that stored nothing of it, for sure (`StoreError.notWritten`). */
export function isNotWritten(err: unknown): boolean {
  return typeof err === 'object' && err !== null && (err as { notWritten?: unknown }).notWritten === true;
}

/** A `StoreError`, of `code` when given (by its code: errors that crossed a worker or a copy of this module count too). */
export function isStoreError(err: unknown, code?: StoreErrorCode): err is StoreError {
  const c = typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined;
  return code === undefined ? err instanceof StoreError : c === code;
}

/** Code of the error thrown by `create` when the key exists and by `update`/`delete` when the revision is stale. */
export const STORE_CONFLICT = 'STORE_CONFLICT';

export class StoreConflictError extends StoreError {
  override readonly name = 'StoreConflictError';
  override readonly code = STORE_CONFLICT satisfies InternalErrorCode;
  constructor(key: string, options?: { cause?: unknown }) {
    super(STORE_CONFLICT, `Conflicting write to ${key}`, options);
  }
}

export function isStoreConflict(err: unknown): boolean {
  return isStoreError(err, STORE_CONFLICT);
}

/** `key` read for an answer, never for a decision: `getRecent` where the store has it, else `get`. */
export function readForAnswer<T>(store: SessionStore, key: string): Promise<Versioned<T> | null> {
  return store.getRecent ? store.getRecent<T>(key) : store.get<T>(key);
}

/**
 * Session state: a key-value store of JSON documents with compare-and-set.
 * Keys are `[A-Za-z0-9_.=-]+` (callers encode anything else); values are JSON-serialisable.
 * Revisions are positive integers that grow with every write to the key.
 */
export interface SessionStore {
  readonly capabilities: SessionStoreCapabilities;
  get<T>(key: string): Promise<Versioned<T> | null>;
  /**
   * A read for answers that may be a moment behind (status, the sessions listing), never for
   * a decision: any replica may answer it as long as it holds everything this instance has
   * read or written of the store, so it keeps answering while a leader is being elected, and
   * it never goes back behind what this instance saw. Without it, `get` serves.
   */
  getRecent?<T>(key: string): Promise<Versioned<T> | null>;
  /**
   * As `get`, for a client error concluded from what the key holds (the active pointer: 400,
   * 403): answers only once a compare-and-set on the key showed that nothing was written there
   * since the read, where a read can be stale (on NATS a deposed leader may answer without a
   * write made during a partition). There it writes the value read again (a new revision, the
   * one returned) or, where the key holds none, a deletion marker: one durable write, so only
   * on an error path and only on keys a client has few of.
   */
  getConfirmed<T>(key: string): Promise<Versioned<T> | null>;
  /**
   * Fairness between processes writing one key (stores of one process need none):
   * `lostWrite` tells the other processes that a compare-and-set of this one on `key` lost;
   * `contended` is whether another said so within the last second. A writer that writes from
   * what it cached outpaces one that must read first after a loss, for as long as it has
   * writes to make; told, it reads first too.
   */
  lostWrite?(key: string): void;
  contended?(key: string): boolean;
  /** Writes only if the key holds no value (never written, or deleted). Throws STORE_CONFLICT otherwise. */
  create<T>(key: string, value: T): Promise<number>;
  /** Writes only if the key's current revision is `revision`. Throws STORE_CONFLICT otherwise. */
  update<T>(key: string, value: T, revision: number): Promise<number>;
  /** Removes the key; with `revision`, only if it is still current (STORE_CONFLICT otherwise). */
  delete(key: string, revision?: number): Promise<void>;
  /**
   * Every key that holds a value (written, not deleted) and starts with `prefix`, each once,
   * with its value and revision as `get` answers them, in no particular order. `prefix` is
   * `''` (every key) or whole dot-separated tokens, each followed by its dot (`idem.`,
   * `idem.<client hex>.`); anything else throws STORE_INVALID_KEY. A key written or deleted
   * while the listing runs may or may not be in it (or may come with its newer value); a key
   * that holds the same value from before the listing begins until it ends is in it. Under a
   * non-empty prefix only keys whose tokens are all non-empty are listed (every key the
   * service writes). It may cost a read per key: for housekeeping, clean-ups and a client's
   * own keys at its budget (`Idempotency-Key` records); the sessions listing names one
   * client's index with `keys` instead.
   */
  list<T>(prefix: string): AsyncIterable<Listed<T>>;
  /**
   * The keys `list` would give, names only, in no particular order, without reading a value:
   * one request whatever their number. May also give keys deleted a moment ago (on NATS, until
   * their deletion markers leave the stream): a caller reads the values it needs and skips
   * what is gone.
   */
  keys(prefix: string): AsyncIterable<string>;
  close(): Promise<void>;
}

/** One key of a `SessionStore.list`. */
export interface Listed<T> extends Versioned<T> {
  key: string;
}

/** A `SessionStore.list` prefix: `''`, or whole non-empty tokens each followed by a dot. */
export const KEY_PREFIX = /^(?:[A-Za-z0-9_=-]+\.)*$/;

export interface SessionStoreCapabilities {
  /**
   * Only the process that opened the store uses it (the embedded files): whatever leases and
   * claims it holds at start are a previous process's, so they may be released at once.
   */
  readonly singleProcess: boolean;
}

/** One recorded package in its session's ledger. */
export interface LedgerEntry {
  package_id: string;
  entity: string;
  rows: number;
  /** Encoded row bytes. */
  bytes: number;
  /** Size of the package's stored object (0 when unknown: recorded by an older version). */
  object_bytes: number;
}

/**
 * The ledger of a session's recorded packages: one entry per package, written once the
 * session summary recorded it (session/state.ts). Writing an entry is idempotent: whoever
 * completes a recording (the gateway that took it, start-upload, a restart) writes the same
 * entry, and writing it again changes nothing. No compare-and-set: entries of different
 * packages never conflict.
 */
export interface PackageLedger {
  /** Writes the entries of one session; resolves once every one of them is durable. */
  append(uploadUuid: string, entries: readonly LedgerEntry[]): Promise<void>;
  /** The entry of one package, or null. Sees every entry whose `append` resolved. */
  get(uploadUuid: string, packageId: string): Promise<LedgerEntry | null>;
  /**
   * As `get`, for a conclusion drawn from absence (a package dropped, a keyed retry ingested
   * anew): null only once a compare-and-set on the entry's key showed that nothing was written
   * there since the read (where it can be stale: on NATS a deposed leader may answer a read
   * without an entry written during a partition). May leave a deletion marker, which `get` and
   * `list` skip.
   */
  getConfirmed(uploadUuid: string, packageId: string): Promise<LedgerEntry | null>;
  /** Every entry of the session, each package once, in no particular order. */
  list(uploadUuid: string): AsyncIterable<LedgerEntry>;
  /**
   * Marks packages as stored in object storage (the uploader, after the put): one marker per
   * package, idempotent, durable when this resolves. A marker may precede the package's entry
   * (the uploader stores what the summary records before the ledger holds it); `list` never
   * yields markers.
   */
  markStored(uploadUuid: string, packageIds: readonly string[]): Promise<void>;
  /** Whether `markStored` wrote the package's marker (every marker whose write resolved is seen). */
  isStored(uploadUuid: string, packageId: string): Promise<boolean>;
  /**
   * A ledger that counts its markers per entity in the same durable step as it writes them
   * has these two (the embedded one: one transaction; the NATS one on servers with atomic
   * batches: one batch); the others are counted apart (session/stored-counts.ts).
   * `countStored` is `markStored` with each package's entity: a package whose marker is new
   * counts once, one marked before never again; and it writes nothing unless the session
   * store holds `summaryKey`, not marked `deleted` (a deleted session's clean-up may have
   * dropped its markers already): checked in the same step where the store allows (embedded),
   * else before the session's first count (NATS: a count racing the clean-up may leave its
   * counts and markers behind, a few keys).
   */
  countStored?(uploadUuid: string, packages: readonly { package_id: string; entity: string }[], summaryKey: string): Promise<void>;
  /** The markers per entity that `countStored` counted; sees every call that resolved. */
  storedCounts?(uploadUuid: string): Promise<Map<string, number>>;
  /** Removes every entry and marker of the session (after delete). */
  drop(uploadUuid: string): Promise<void>;
  close(): Promise<void>;
}

/** What identifies one accepted package: its rows land in exactly one stored object. */
export interface PackageMeta {
  package_id: string;
  client_id: string;
  upload_uuid: string;
  entity: string;
  columns: string[];
}

/** A package being written: batches stay invisible to consumers until `commit` resolves. */
export interface PackageWriter {
  /**
   * Appends one encoded batch (bytes of NDJSON rows). Batches keep their order. The caller
   * may reuse the batch's memory once the promise settles (the ingest sink hands its line
   * buffers back to the pool then): copy what must outlive it.
   */
  append(batch: Uint8Array): Promise<void>;
  /** Makes the package durable and visible to consumers, with its totals. Resolves once durable. */
  commit(totals: { rows: number; bytes: number }): Promise<void>;
  /** Drops everything appended; the package is never seen. Safe to call after a failed append. */
  abort(): Promise<void>;
}

export interface CommittedPackage {
  meta: PackageMeta;
  rows: number;
  bytes: number;
  /** Delivery attempt, from 1. */
  attempt: number;
  /**
   * The package's batches, in append order. May be read once per delivery. With `reuse`, a
   * chunk is valid only until the iteration moves on (the adapter may read the next one into
   * the same memory): for consumers that are done with each chunk before asking for the next.
   */
  batches(opts?: { reuse?: boolean }): AsyncIterable<Uint8Array>;
}

export interface QueueConsumer {
  /** Stops taking new packages and waits for the one in hand. */
  stop(): Promise<void>;
}

/**
 * Durable queue of validated batches between the gateway and the uploader.
 * Delivery is at-least-once: a package is acked only when the handler resolves; a throwing
 * handler (or a crashed consumer) gets it delivered again later.
 */
export interface BatchQueue {
  open(meta: PackageMeta): Promise<PackageWriter>;
  consume(handler: (pkg: CommittedPackage) => Promise<void>): QueueConsumer;
  /** Committed packages of the session not yet acked by a consumer. */
  pending(uploadUuid: string): Promise<number>;
  /**
   * Whether any is (`pending(uploadUuid) > 0`), without counting them: status and
   * start-upload ask on every call, however many packages the session holds. `forAnswer`
   * (status): the answer may be a moment behind other processes' writes and acks, as
   * `SessionStore.getRecent` is, and keeps coming while a leader is elected; never for a decision.
   * `stored` (start-upload): a second opinion on each package the queue would count, asked
   * only then; a package it says is stored in object storage is not pending, whether or not
   * its ack has come or is seen yet (a queue replicated across servers may read an older
   * ack floor than the one status read a moment before).
   */
  hasPending(uploadUuid: string, opts?: { forAnswer?: boolean; stored?: (packageId: string) => Promise<boolean> }): Promise<boolean>;
  /**
   * Committed packages of every session not yet acked (the one in a handler included), and
   * the age of the oldest of them in ms (null when there is none): the uploader's lag. One
   * or two cheap requests, whatever the number of packages; for metrics at scrape time.
   */
  backlog(): Promise<QueueBacklog>;
  /** Drops every package of the session, committed or not. */
  purge(uploadUuid: string): Promise<void>;
  close(): Promise<void>;
}

export interface QueueBacklog {
  packages: number;
  oldestAgeMs: number | null;
}

export interface StoredObject {
  key: string;
  size: number;
}

export interface ObjectStoreCapabilities {
  /** `put` is done with each chunk of its body before it asks for the next (so the chunks may share memory). */
  readonly consumesChunksInTurn: boolean;
}

/** Object storage. A `put` is atomic: readers see the whole object or none of it. */
export interface ObjectStore {
  /** Stores the stream under `key`, replacing any object there. Resolves once durable. */
  put(key: string, body: AsyncIterable<Uint8Array>): Promise<StoredObject>;
  readonly capabilities: ObjectStoreCapabilities;
  get(key: string): Promise<AsyncIterable<Uint8Array> | null>;
  /** Objects whose key starts with `prefix`, in key order. */
  list(prefix: string): Promise<StoredObject[]>;
  /** Removes every object whose key starts with `prefix`. */
  deletePrefix(prefix: string): Promise<void>;
  close(): Promise<void>;
}
