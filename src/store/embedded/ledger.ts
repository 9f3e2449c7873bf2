import { createReadStream } from 'node:fs';
import { mkdir, open, readdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { StoreError, type LedgerEntry, type PackageLedger } from '../ports.js';
import { AppendFile } from './append-file.js';
import { OpenHandles } from './open-handles.js';

export interface FileLedgerOptions {
  /** Package ids kept in memory over all sessions (for `get` and de-duplication); beyond it the least recently used sessions are forgotten and read again from disk when asked. Default 1,000,000. */
  maxIndexedIds?: number;
  /** Session files kept open. Default 64. */
  maxOpenFiles?: number;
  /** Size past which the write-ahead log is checkpointed (session files synced, the log removed). Default 8 MiB. */
  walBytes?: number;
}

/** A line of the write-ahead log: entries of one session, or the drop of one. */
type WalRecord = { s: string; e: LedgerEntry[] } | { drop: string };

/** One write-ahead log and what its checkpoint must make durable before the log may go. */
interface WalGeneration {
  no: number;
  wal: Promise<AppendFile>;
  /** Sessions whose file got lines logged here. */
  dirty: Set<string>;
  /** Appends to this log still in flight (their lines not yet handed to `pending`). */
  writes: Set<Promise<void>>;
}

const WAL = /^wal-(\d+)\.log$/;

const ID = /^[A-Za-z0-9_.=-]+$/;

/**
 * `PackageLedger` on local files: one append-only NDJSON file per session under `dir`, one
 * line per entry. An append is durable once its line is in the write-ahead log
 * (`wal-<n>.log`, shared by every session and group-committed: one fdatasync for every
 * append of every session that came meanwhile); the session file gets the same line
 * later, without an fsync of its own: lines wait in memory until the session is read from
 * its file (`list`, loading its ids), the log is checkpointed or the ledger closed, so that
 * many appends of a session cost one write of its file, not one each (the log bounds what
 * waits). Past `walBytes` the log is checkpointed: a new log takes the appends, every
 * waiting line is written, the session files written under the old one are fdatasync'ed,
 * and the old log goes. Opening replays whatever logs are left (a crash before their checkpoint) into the
 * session files, drops included, before anything is read. A session file's line may so
 * appear twice: reads keep one entry per package. A torn last line (a crash in the middle
 * of a write) is skipped when read, and the next write to that file starts on a new line.
 *
 * Which ids a session holds is kept in memory, loaded from the file the first time a session
 * is asked about, and forgotten for the least recently used sessions beyond `maxIndexedIds`;
 * an id already in the index is not written again (appending is idempotent).
 */
export class FileLedger implements PackageLedger {
  readonly #dir: string;
  readonly #maxIds: number;
  /** Session → its entries by package id; Map order is least recently used first. */
  readonly #index = new Map<string, Map<string, LedgerEntry>>();
  #indexed = 0;
  /** Open session files. */
  readonly #files: OpenHandles<AppendFile>;
  /** Per session: lines logged but not yet written to its file. */
  readonly #pending = new Map<string, string[]>();
  /** Writes of waiting lines to session files still in flight. */
  readonly #flushing = new Set<Promise<void>>();
  /** Per session: the load of its index in progress. */
  readonly #loading = new Map<string, Promise<Map<string, LedgerEntry>>>();
  readonly #walBytes: number;
  #gen: WalGeneration;
  /** Checkpoints under way (each of an older log). */
  readonly #checkpoints = new Set<Promise<void>>();
  #closed = false;

  private constructor(dir: string, opts: FileLedgerOptions, walNo: number) {
    this.#dir = dir;
    this.#maxIds = opts.maxIndexedIds ?? 1_000_000;
    this.#files = new OpenHandles({ max: opts.maxOpenFiles ?? 64, open: (uuid) => AppendFile.openLines(this.#path(uuid)), close: (file) => file.close() });
    this.#walBytes = opts.walBytes ?? 8 * 1024 * 1024;
    this.#gen = this.#generation(walNo);
  }

  static async open(dir: string, opts: FileLedgerOptions = {}): Promise<FileLedger> {
    await mkdir(dir, { recursive: true });
    const logs = await walNumbers(dir);
    if (logs.length > 0) await FileLedger.#replay(dir, logs);
    return new FileLedger(dir, opts, (logs.at(-1) ?? 0) + 1);
  }

  /**
   * Writes what the logs hold into the session files, applies drops in log order, syncs
   * every file touched, then removes the logs. A torn last log line was never acknowledged:
   * it is skipped.
   */
  static async #replay(dir: string, logs: number[]): Promise<void> {
    const pending = new Map<string, string[]>();
    const dropped = new Set<string>();
    for await (const record of walRecords(dir, logs)) {
      if ('drop' in record) {
        pending.delete(record.drop);
        dropped.add(record.drop);
      } else {
        const lines = pending.get(record.s) ?? [];
        for (const e of record.e) lines.push(`${JSON.stringify(e)}\n`);
        pending.set(record.s, lines);
        dropped.delete(record.s);
      }
    }
    for (const uuid of dropped) await rm(join(dir, `${uuid}.ndjson`), { force: true });
    for (const [uuid, lines] of pending) {
      const file = await AppendFile.openLines(join(dir, `${uuid}.ndjson`));
      try {
        await file.append(Buffer.from(lines.join('')));
      } finally {
        await file.close();
      }
    }
    for (const no of logs) await rm(join(dir, `wal-${no}.log`), { force: true });
  }

  /**
   * The entries of one session as the files in `dir` hold them, without opening the ledger
   * (tests, tools; the owner may be running): its session file, then every log not yet
   * checkpointed (lines of a live ledger wait there before they reach the session file).
   */
  static async peek(dir: string, uploadUuid: string): Promise<LedgerEntry[]> {
    const found = new Map<string, LedgerEntry>();
    const file = await readFile(join(dir, `${uploadUuid}.ndjson`), 'utf8').catch(() => '');
    for (const e of parseLines<LedgerEntry>(file)) if (!found.has(e.package_id)) found.set(e.package_id, e);
    for await (const record of walRecords(dir, await walNumbers(dir))) {
      if ('drop' in record) {
        if (record.drop === uploadUuid) found.clear();
      } else if (record.s === uploadUuid) {
        for (const e of record.e) if (!found.has(e.package_id)) found.set(e.package_id, e);
      }
    }
    return [...found.values()];
  }

  async append(uploadUuid: string, entries: readonly LedgerEntry[]): Promise<void> {
    this.#check(uploadUuid);
    const index = await this.#entries(uploadUuid);
    const fresh = entries.filter((e) => !index.has(e.package_id));
    if (fresh.length === 0) return;
    for (const e of fresh) this.#remember(uploadUuid, index, e);
    const gen = this.#gen;
    try {
      // Counted in the log's generation at once: its checkpoint waits for this append.
      gen.dirty.add(uploadUuid);
      const logged = (async () => {
        await (await gen.wal).append(Buffer.from(`${JSON.stringify({ s: uploadUuid, e: fresh } satisfies WalRecord)}\n`));
        // Durable: the session file gets the lines later (see the class).
        const waiting = this.#pending.get(uploadUuid) ?? [];
        for (const e of fresh) waiting.push(`${JSON.stringify(e)}\n`);
        this.#pending.set(uploadUuid, waiting);
      })();
      gen.writes.add(logged);
      void logged.then(
        () => gen.writes.delete(logged),
        () => gen.writes.delete(logged),
      );
      await logged;
      if ((await gen.wal).size >= this.#walBytes && this.#gen === gen) this.#rotate();
    } catch (err) {
      // Not durable: forget them, so that a retry writes them again (into a fresh log, if this one failed).
      for (const e of fresh) if (index.delete(e.package_id)) this.#indexed--;
      if (this.#gen === gen) this.#rotate();
      throw err;
    }
  }

  async get(uploadUuid: string, packageId: string): Promise<LedgerEntry | null> {
    this.#check(uploadUuid);
    return (await this.#entries(uploadUuid)).get(packageId) ?? null;
  }

  async *list(uploadUuid: string): AsyncIterable<LedgerEntry> {
    this.#check(uploadUuid);
    await this.#settled(uploadUuid);
    const seen = new Set<string>();
    for await (const entry of this.#read(uploadUuid)) {
      if (seen.has(entry.package_id)) continue;
      seen.add(entry.package_id);
      yield entry;
    }
  }

  async drop(uploadUuid: string): Promise<void> {
    this.#check(uploadUuid);
    this.#pending.delete(uploadUuid);
    this.#files.retire((uuid) => uuid === uploadUuid);
    this.#forget(uploadUuid);
    // Logged first: a replay of an older line of this session must not bring the file back.
    await (await this.#gen.wal).append(Buffer.from(`${JSON.stringify({ drop: uploadUuid } satisfies WalRecord)}\n`));
    await rm(this.#path(uploadUuid), { force: true });
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.allSettled([...this.#checkpoints]);
    // A clean stop leaves no log to replay.
    await this.#checkpoint(this.#gen);
    await this.#files.closeAll();
  }

  #generation(no: number): WalGeneration {
    const wal = AppendFile.open(join(this.#dir, `wal-${no}.log`));
    wal.catch(() => undefined);
    return { no, wal, dirty: new Set(), writes: new Set() };
  }

  /**
   * A new log takes the appends from now on; the old one goes once every session file it
   * covers is durable. A failed checkpoint leaves the old log for the next start to replay.
   */
  #rotate(): void {
    const old = this.#gen;
    this.#gen = this.#generation(old.no + 1);
    const run = this.#checkpoint(old);
    this.#checkpoints.add(run);
    void run.finally(() => this.#checkpoints.delete(run));
  }

  /** Writes the waiting lines, syncs the session files a log covers, then removes the log; never throws (a log left is replayed at the next start). */
  async #checkpoint(gen: WalGeneration): Promise<void> {
    try {
      await Promise.allSettled([...gen.writes]);
      // Every line of this log is waiting or written; lines of the next log may go too.
      await Promise.all([...this.#pending.keys()].map((uuid) => this.#flush(uuid)));
      await Promise.all([...this.#flushing]);
      for (const uuid of gen.dirty) await this.#syncSessionFile(uuid);
      const wal = await gen.wal;
      await wal.close();
      await rm(wal.path, { force: true });
    } catch {
      // left for the replay
    }
  }

  async #syncSessionFile(uploadUuid: string): Promise<void> {
    const file = await this.#files.peek(uploadUuid);
    if (file) return file.sync().catch(() => this.#syncPath(uploadUuid));
    await this.#syncPath(uploadUuid);
  }

  /** fdatasync through a descriptor of its own (any descriptor flushes the file); a dropped session's file is gone: nothing to sync. */
  async #syncPath(uploadUuid: string): Promise<void> {
    let fh;
    try {
      fh = await open(this.#path(uploadUuid), 'r');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw err;
    }
    try {
      await fh.datasync();
    } finally {
      await fh.close();
    }
  }

  /** Sessions that have a ledger file or lines waiting for one (for recovery at start). */
  async sessions(): Promise<string[]> {
    const files = (await readdir(this.#dir)).filter((n) => n.endsWith('.ndjson')).map((n) => n.slice(0, -'.ndjson'.length));
    return [...new Set([...files, ...this.#pending.keys()])];
  }

  async #entries(uploadUuid: string): Promise<Map<string, LedgerEntry>> {
    const known = this.#index.get(uploadUuid);
    if (known) {
      // Most recently used last.
      this.#index.delete(uploadUuid);
      this.#index.set(uploadUuid, known);
      return known;
    }
    let loading = this.#loading.get(uploadUuid);
    if (!loading) {
      loading = (async () => {
        await this.#settled(uploadUuid);
        const entries = new Map<string, LedgerEntry>();
        for await (const e of this.#read(uploadUuid)) entries.set(e.package_id, e);
        return entries;
      })();
      this.#loading.set(uploadUuid, loading);
      void loading.finally(() => this.#loading.delete(uploadUuid)).catch(() => undefined);
    }
    const entries = await loading;
    if (!this.#index.has(uploadUuid)) {
      this.#index.set(uploadUuid, entries);
      this.#indexed += entries.size;
      this.#evict(uploadUuid);
    }
    return this.#index.get(uploadUuid)!;
  }

  #remember(uploadUuid: string, index: Map<string, LedgerEntry>, e: LedgerEntry): void {
    index.set(e.package_id, e);
    this.#indexed++;
    this.#evict(uploadUuid);
  }

  /** Forgets least recently used sessions (never `keep`) until the index fits. */
  #evict(keep: string): void {
    for (const uuid of this.#index.keys()) {
      if (this.#indexed <= this.#maxIds) return;
      if (uuid !== keep) this.#forget(uuid);
    }
  }

  #forget(uploadUuid: string): void {
    const entries = this.#index.get(uploadUuid);
    if (!entries) return;
    this.#indexed -= entries.size;
    this.#index.delete(uploadUuid);
  }

  async *#read(uploadUuid: string): AsyncIterable<LedgerEntry> {
    const stream = createReadStream(this.#path(uploadUuid));
    const missing = new Promise<boolean>((resolve) => {
      stream.once('open', () => resolve(false));
      stream.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ENOENT'));
    });
    if (await missing) return;
    for await (const line of createInterface({ input: stream, crlfDelay: Infinity })) {
      if (line === '') continue;
      try {
        yield JSON.parse(line) as LedgerEntry;
      } catch {
        // A torn last line: its append never resolved.
      }
    }
  }

  #withFile<R>(uploadUuid: string, fn: (file: AppendFile) => Promise<R>): Promise<R> {
    return this.#files.use(uploadUuid, fn);
  }

  /**
   * Writes the session's waiting lines to its file. A failed write puts them back: they stay
   * in the log, whose checkpoint then fails and leaves it for the replay.
   */
  #flush(uploadUuid: string): Promise<void> {
    const lines = this.#pending.get(uploadUuid);
    if (!lines) return Promise.resolve();
    this.#pending.delete(uploadUuid);
    const written = this.#withFile(uploadUuid, (file) => file.write(Buffer.from(lines.join(''))).written).catch((err: unknown) => {
      this.#pending.set(uploadUuid, [...lines, ...(this.#pending.get(uploadUuid) ?? [])]);
      throw err;
    });
    this.#flushing.add(written);
    void written.then(
      () => this.#flushing.delete(written),
      () => this.#flushing.delete(written),
    );
    return written;
  }

  /** Writes the session's waiting lines and waits for writes in progress to its file, so that a read sees them. */
  async #settled(uploadUuid: string): Promise<void> {
    await this.#flush(uploadUuid);
    await (await this.#files.peek(uploadUuid))?.settled();
  }

  #path(uploadUuid: string): string {
    return join(this.#dir, `${uploadUuid}.ndjson`);
  }

  #check(uploadUuid: string): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Ledger is closed');
    if (!ID.test(uploadUuid) || uploadUuid === '.' || uploadUuid === '..') throw new StoreError('STORE_INVALID_KEY', `Invalid upload_uuid ${JSON.stringify(uploadUuid)}`);
  }
}

/** The numbers of the write-ahead logs in `dir`, oldest first. */
async function walNumbers(dir: string): Promise<number[]> {
  return (await readdir(dir).catch(() => [] as string[]))
    .map((n) => Number(WAL.exec(n)?.[1] ?? NaN))
    .filter(Number.isInteger)
    .sort((a, b) => a - b);
}

/** The records of the logs `logs` in `dir`, in order; a log gone meanwhile (a checkpoint) holds none, any other failure throws. */
async function* walRecords(dir: string, logs: readonly number[]): AsyncIterable<WalRecord> {
  for (const no of logs) {
    const text = await readFile(join(dir, `wal-${no}.log`), 'utf8').catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return '';
      throw err;
    });
    yield* parseLines<WalRecord>(text);
  }
}

/** The JSON lines of `text`; an empty line or a torn one (an append that never resolved) is skipped. */
function* parseLines<T>(text: string): Iterable<T> {
  for (const line of text.split('\n')) {
    if (!line) continue;
    try {
      yield JSON.parse(line) as T;
    } catch {
      // torn
    }
  }
}
