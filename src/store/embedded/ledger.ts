import { createReadStream } from 'node:fs';
import { mkdir, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { StoreError, type LedgerEntry, type PackageLedger } from '../ports.js';
import { AppendFile } from './append-file.js';

export interface FileLedgerOptions {
  /** Package ids kept in memory over all sessions (for `get` and de-duplication); beyond it the least recently used sessions are forgotten and read again from disk when asked. Default 1,000,000. */
  maxIndexedIds?: number;
  /** Session files kept open. Default 64. */
  maxOpenFiles?: number;
}

const ID = /^[A-Za-z0-9_.=-]+$/;

/**
 * `PackageLedger` on local files: one append-only NDJSON file per session under `dir`, one
 * line per entry, group-committed (`AppendFile`: one fdatasync per file for every entry
 * appended meanwhile). A torn last line (a crash in the middle of an append that was never
 * acknowledged) is skipped when read.
 *
 * Which ids a session holds is kept in memory, loaded from the file the first time a session
 * is asked about, and forgotten for the least recently used sessions beyond `maxIndexedIds`;
 * an id already in the index is not written again (appending is idempotent).
 */
export class FileLedger implements PackageLedger {
  readonly #dir: string;
  readonly #maxIds: number;
  readonly #maxFiles: number;
  /** Session → its entries by package id; Map order is least recently used first. */
  readonly #index = new Map<string, Map<string, LedgerEntry>>();
  #indexed = 0;
  /** Open session files, least recently used first; a file with users is never closed. */
  readonly #files = new Map<string, { file: Promise<AppendFile>; users: number }>();
  /** Per session: the load of its index in progress. */
  readonly #loading = new Map<string, Promise<Map<string, LedgerEntry>>>();
  #closed = false;

  private constructor(dir: string, opts: FileLedgerOptions) {
    this.#dir = dir;
    this.#maxIds = opts.maxIndexedIds ?? 1_000_000;
    this.#maxFiles = opts.maxOpenFiles ?? 64;
  }

  static async open(dir: string, opts: FileLedgerOptions = {}): Promise<FileLedger> {
    await mkdir(dir, { recursive: true });
    return new FileLedger(dir, opts);
  }

  async append(uploadUuid: string, entries: readonly LedgerEntry[]): Promise<void> {
    this.#check(uploadUuid);
    const index = await this.#entries(uploadUuid);
    const fresh = entries.filter((e) => !index.has(e.package_id));
    if (fresh.length === 0) return;
    for (const e of fresh) this.#remember(uploadUuid, index, e);
    try {
      await this.#withFile(uploadUuid, (file) => file.append(Buffer.from(fresh.map((e) => `${JSON.stringify(e)}\n`).join(''))));
    } catch (err) {
      // Not durable: forget them, so that a retry writes them again.
      for (const e of fresh) if (index.delete(e.package_id)) this.#indexed--;
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
    const slot = this.#files.get(uploadUuid);
    this.#files.delete(uploadUuid);
    this.#forget(uploadUuid);
    if (slot) await (await slot.file).close().catch(() => undefined);
    await rm(this.#path(uploadUuid), { force: true });
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.allSettled([...this.#files.values()].map(async (slot) => (await slot.file).close()));
    this.#files.clear();
  }

  /** Sessions that have a ledger file (for recovery at start). */
  async sessions(): Promise<string[]> {
    return (await readdir(this.#dir)).filter((n) => n.endsWith('.ndjson')).map((n) => n.slice(0, -'.ndjson'.length));
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

  async #withFile<R>(uploadUuid: string, fn: (file: AppendFile) => Promise<R>): Promise<R> {
    let slot = this.#files.get(uploadUuid);
    if (slot) this.#files.delete(uploadUuid);
    else slot = { file: AppendFile.open(this.#path(uploadUuid)), users: 0 };
    this.#files.set(uploadUuid, slot);
    slot.users++;
    try {
      return await fn(await slot.file);
    } catch (err) {
      if (this.#files.get(uploadUuid) === slot && !(await slot.file.then(() => true, () => false))) this.#files.delete(uploadUuid);
      throw err;
    } finally {
      slot.users--;
      this.#trimFiles();
    }
  }

  #trimFiles(): void {
    for (const [uuid, slot] of this.#files) {
      if (this.#files.size <= this.#maxFiles) return;
      if (slot.users > 0) continue;
      this.#files.delete(uuid);
      void slot.file.then((open) => open.close()).catch(() => undefined);
    }
  }

  /** Waits for writes in progress to the session's file, so that a read sees them. */
  async #settled(uploadUuid: string): Promise<void> {
    const slot = this.#files.get(uploadUuid);
    if (slot) await (await slot.file.catch(() => null))?.settled();
  }

  #path(uploadUuid: string): string {
    return join(this.#dir, `${uploadUuid}.ndjson`);
  }

  #check(uploadUuid: string): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Ledger is closed');
    if (!ID.test(uploadUuid) || uploadUuid === '.' || uploadUuid === '..') throw new StoreError('STORE_INVALID_KEY', `Invalid upload_uuid ${JSON.stringify(uploadUuid)}`);
  }
}
