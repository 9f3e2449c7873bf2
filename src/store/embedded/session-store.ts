import { mkdir, readFile, readdir, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { writeFileAtomic } from '../../durable-file.js';
import { KEY_PREFIX, StoreError, StoreConflictError, type Listed, type SessionStore, type Versioned } from '../ports.js';
import { AppendFile } from './append-file.js';

const KEY = /^[A-Za-z0-9_.=-]+$/;

/** A key's latest write. A deleted key keeps its revision as a tombstone, so revisions never repeat. */
interface Entry {
  revision: number;
  /** The value as JSON text; absent on a tombstone. Kept serialised so callers never share objects. */
  json?: string;
}

export interface FileSessionStoreOptions {
  /** A journal past this size (and past twice the last snapshot) is folded into a new snapshot. Default 64 MiB. */
  compactBytes?: number;
}

const SNAPSHOT = /^snapshot-(\d+)\.ndjson$/;
const JOURNAL = /^journal-(\d+)\.ndjson$/;

/**
 * `SessionStore` on local files, for one process: every key lives in memory, and every
 * write is one line appended to a journal, group-committed (`AppendFile`: one fdatasync for
 * every write of every key that came meanwhile, instead of a file, an fsync, a rename and a
 * directory fsync per write). Compare-and-set is decided in memory, in call order; a write
 * resolves, and its value becomes readable, once its line is durable.
 *
 * ```
 * <dir>/snapshot-<n>.ndjson   every key as of the start of journal n (written atomically)
 * <dir>/journal-<n>.ndjson    the writes since, one {"k","r","v"} line each
 * ```
 * A journal that outgrows `compactBytes` and twice the snapshot is closed, the next one
 * opened, and the whole state written as snapshot n+1; then the older files go. Replaying is
 * idempotent (each line carries the key's revision), so a crash anywhere in between loses
 * nothing. A torn last line (a write that never resolved) is ignored. One file per key, as
 * versions before the journal wrote them, is read once at open and folded into a snapshot.
 */
export class FileSessionStore implements SessionStore {
  /** The files belong to this process alone. */
  readonly capabilities = { singleProcess: true } as const;
  readonly #dir: string;
  readonly #compactBytes: number;
  readonly #entries: Map<string, Entry>;
  /** Per key: the durability of its latest write, while it is not yet durable. */
  readonly #unsynced = new Map<string, Promise<unknown>>();
  #journal: AppendFile;
  #journalNo: number;
  #snapshotBytes: number;
  #compacting: Promise<void> | null = null;
  #closed = false;

  private constructor(dir: string, entries: Map<string, Entry>, journal: AppendFile, journalNo: number, snapshotBytes: number, opts: FileSessionStoreOptions) {
    this.#dir = dir;
    this.#entries = entries;
    this.#journal = journal;
    this.#journalNo = journalNo;
    this.#snapshotBytes = snapshotBytes;
    this.#compactBytes = opts.compactBytes ?? 64 * 1024 * 1024;
  }

  static async open(dir: string, opts: FileSessionStoreOptions = {}): Promise<FileSessionStore> {
    await mkdir(dir, { recursive: true });
    const state = await load(dir);
    let { journalNo, snapshotBytes } = state;
    if (state.legacy.length > 0) {
      // Fold the per-key files of an older version into a snapshot, then let them go.
      journalNo += 1;
      snapshotBytes = await writeSnapshot(dir, journalNo, state.entries);
      for (const name of state.legacy) await unlink(join(dir, name)).catch(() => undefined);
    }
    for (const name of state.stale) await unlink(join(dir, name)).catch(() => undefined);
    const journal = await AppendFile.open(join(dir, `journal-${journalNo}.ndjson`), { size: state.journalSize });
    return new FileSessionStore(dir, state.entries, journal, journalNo, snapshotBytes, opts);
  }

  /** Reads one key as the store in `dir` holds it, without opening it (tests, tools; the owner may be running). */
  static async peek<T>(dir: string, key: string): Promise<Versioned<T> | null> {
    const entry = (await load(dir)).entries.get(checkKey(key));
    return entry?.json === undefined ? null : { value: JSON.parse(entry.json) as T, revision: entry.revision };
  }

  async get<T>(key: string): Promise<Versioned<T> | null> {
    this.#check();
    checkKey(key);
    await this.#unsynced.get(key);
    const entry = this.#entries.get(key);
    return entry?.json === undefined ? null : { value: JSON.parse(entry.json) as T, revision: entry.revision };
  }

  /** The port's listing (store/ports.ts): the keys in memory, each read as `get` reads it. */
  async *list<T>(prefix: string): AsyncIterable<Listed<T>> {
    this.#check();
    if (!KEY_PREFIX.test(prefix)) throw new StoreError('STORE_INVALID_KEY', `Invalid session store key prefix ${JSON.stringify(prefix)}`);
    for (const key of [...this.#entries.keys()]) {
      if (!key.startsWith(prefix)) continue;
      const found = await this.get<T>(key);
      if (found) yield { key, ...found };
    }
  }

  create<T>(key: string, value: T): Promise<number> {
    return this.#write(key, value, (cur) => cur?.json === undefined);
  }

  update<T>(key: string, value: T, revision: number): Promise<number> {
    return this.#write(key, value, (cur) => cur?.json !== undefined && cur.revision === revision);
  }

  async delete(key: string, revision?: number): Promise<void> {
    await this.#write(key, undefined, (cur) => (revision === undefined ? true : cur?.json !== undefined && cur.revision === revision));
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#compacting;
    await Promise.allSettled([...this.#unsynced.values()]);
    await this.#journal.close();
  }

  /** `value` undefined writes a tombstone (a no-op when the key holds nothing). */
  #write(key: string, value: unknown, allowed: (cur: Entry | undefined) => boolean): Promise<number> {
    try {
      this.#check();
      checkKey(key);
      const json = value === undefined ? undefined : JSON.stringify(value);
      if (value !== undefined && json === undefined) throw new TypeError(`Value of ${key} is not JSON`);
      const cur = this.#entries.get(key);
      if (!allowed(cur)) throw new StoreConflictError(key);
      if (json === undefined && cur?.json === undefined) return this.#settled(key, cur?.revision ?? 0);
      const next: Entry = json === undefined ? { revision: (cur?.revision ?? 0) + 1 } : { revision: (cur?.revision ?? 0) + 1, json };
      this.#entries.set(key, next);
      const durable = this.#journal.append(Buffer.from(`${line(key, next)}\n`));
      this.#unsynced.set(key, durable);
      void durable.then(
        () => this.#synced(key, durable),
        () => this.#synced(key, durable),
      );
      this.#maybeCompact();
      return durable.then(() => next.revision);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /** A write that changes nothing still answers only once the key's earlier writes are durable. */
  async #settled(key: string, revision: number): Promise<number> {
    await this.#unsynced.get(key);
    return revision;
  }

  #synced(key: string, durable: Promise<unknown>): void {
    if (this.#unsynced.get(key) === durable) this.#unsynced.delete(key);
  }

  #maybeCompact(): void {
    if (this.#compacting || this.#journal.size < Math.max(this.#compactBytes, 2 * this.#snapshotBytes)) return;
    this.#compacting = this.#compact().finally(() => (this.#compacting = null));
  }

  async #compact(): Promise<void> {
    const old = this.#journal;
    const oldNo = this.#journalNo;
    const no = oldNo + 1;
    // New writes go to the next journal at once; the snapshot covers everything before it.
    this.#journal = await AppendFile.open(join(this.#dir, `journal-${no}.ndjson`));
    this.#journalNo = no;
    try {
      await old.sync();
      this.#snapshotBytes = await writeSnapshot(this.#dir, no, this.#entries);
      await old.close();
      await unlink(old.path).catch(() => undefined);
      await unlink(join(this.#dir, `snapshot-${oldNo}.ndjson`)).catch(() => undefined);
    } catch {
      // The old journal and snapshot stay; the next open replays them. The next compaction tries again.
    }
  }

  #check(): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Session store is closed');
  }
}

function line(key: string, e: Entry): string {
  return e.json === undefined ? `{"k":${JSON.stringify(key)},"r":${e.revision}}` : `{"k":${JSON.stringify(key)},"r":${e.revision},"v":${e.json}}`;
}

async function writeSnapshot(dir: string, no: number, entries: ReadonlyMap<string, Entry>): Promise<number> {
  const text = [...entries].map(([k, e]) => `${line(k, e)}\n`).join('');
  await writeFileAtomic(join(dir, `snapshot-${no}.ndjson`), text);
  return Buffer.byteLength(text);
}

/** The state the files in `dir` hold: the newest snapshot, then the journals from its number on. */
async function load(dir: string): Promise<{
  entries: Map<string, Entry>;
  journalNo: number;
  journalSize: number;
  snapshotBytes: number;
  /** Per-key files of an older version. */
  legacy: string[];
  /** Files a finished compaction left behind. */
  stale: string[];
}> {
  const names = await readdir(dir);
  const numbered = (re: RegExp) =>
    names
      .map((n) => ({ name: n, no: Number(re.exec(n)?.[1] ?? NaN) }))
      .filter((f) => Number.isInteger(f.no))
      .sort((a, b) => a.no - b.no);
  const snapshots = numbered(SNAPSHOT);
  const journals = numbered(JOURNAL);
  const entries = new Map<string, Entry>();
  const apply = (k: string, e: Entry) => {
    if ((entries.get(k)?.revision ?? 0) <= e.revision) entries.set(k, e);
  };
  const legacy: string[] = [];
  const stale: string[] = [];
  const newest = snapshots.at(-1);
  let snapshotBytes = 0;
  if (newest) {
    const text = await readFile(join(dir, newest.name), 'utf8');
    snapshotBytes = Buffer.byteLength(text);
    forEachLine(text, apply);
    stale.push(...snapshots.slice(0, -1).map((s) => s.name));
  } else {
    for (const name of names) {
      if (name.endsWith('.tmp')) stale.push(name);
      else if (name.endsWith('.json')) {
        // `<key>.json` of an older version; upper-case letters were written as `^a`.
        const stored = JSON.parse(await readFile(join(dir, name), 'utf8')) as { revision: number; value?: unknown };
        const key = name.slice(0, -'.json'.length).replace(/\^([a-z])/g, (_, c: string) => c.toUpperCase());
        apply(key, 'value' in stored ? { revision: stored.revision, json: JSON.stringify(stored.value) } : { revision: stored.revision });
        legacy.push(name);
      }
    }
  }
  const from = newest?.no ?? journals[0]?.no ?? 0;
  let journalNo = from;
  let journalSize = 0;
  for (const j of journals) {
    if (j.no < from) {
      stale.push(j.name);
      continue;
    }
    const buf = await readFile(join(dir, j.name));
    journalNo = j.no;
    journalSize = forEachLine(buf.toString('utf8'), apply);
  }
  for (const name of names) if (name.endsWith('.tmp') && !stale.includes(name)) stale.push(name);
  return { entries, journalNo, journalSize, snapshotBytes, legacy, stale };
}

/** Applies each complete line; returns the byte length of the complete lines (a torn tail is left out). */
function forEachLine(text: string, apply: (key: string, e: Entry) => void): number {
  let good = 0;
  let start = 0;
  for (let nl = text.indexOf('\n'); nl >= 0; nl = text.indexOf('\n', start)) {
    const raw = text.slice(start, nl);
    start = nl + 1;
    let rec: { k: string; r: number; v?: unknown };
    try {
      rec = JSON.parse(raw) as typeof rec;
    } catch {
      break;
    }
    apply(rec.k, 'v' in rec ? { revision: rec.r, json: JSON.stringify(rec.v) } : { revision: rec.r });
    good += Buffer.byteLength(raw) + 1;
  }
  return good;
}

function checkKey(key: string): string {
  if (!KEY.test(key)) throw new StoreError('STORE_INVALID_KEY', `Invalid session store key ${JSON.stringify(key)}: allowed are [A-Za-z0-9_.=-]+`);
  return key;
}
