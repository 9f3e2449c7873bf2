import { randomBytes } from 'node:crypto';
import { mkdir, open, readFile, readdir, rename, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { StoreConflictError, type SessionStore, type Versioned } from '../ports.js';
import { writeFileAtomic } from '../../durable-file.js';

const KEY = /^[A-Za-z0-9_.=-]+$/;

/** What a key's file holds. A deleted key keeps its file as a tombstone so revisions never repeat. */
interface Record {
  revision: number;
  /** The value as JSON text; absent on a tombstone. Kept serialised so callers never share objects. */
  json?: string;
}

/**
 * `SessionStore` on local files: one JSON file per key under `dir`, written by
 * temp file + fsync + rename + directory fsync. Writes to one key are serialised in-process,
 * which gives the compare-and-set; the directory must belong to this process alone.
 */
export class FileSessionStore implements SessionStore {
  readonly #dir: string;
  readonly #cache = new Map<string, Record>();
  readonly #locks = new Map<string, Promise<unknown>>();
  #closed = false;

  private constructor(dir: string) {
    this.#dir = dir;
  }

  static async open(dir: string): Promise<FileSessionStore> {
    await mkdir(dir, { recursive: true });
    for (const name of await readdir(dir)) {
      if (name.endsWith('.tmp')) await unlink(join(dir, name)).catch(() => {});
    }
    return new FileSessionStore(dir);
  }

  async get<T>(key: string): Promise<Versioned<T> | null> {
    if (this.#closed) throw new Error('Session store is closed');
    const rec = this.#cache.get(checkKey(key)) ?? (await this.#locked(key, () => this.#load(key)));
    return rec.json === undefined ? null : { value: JSON.parse(rec.json) as T, revision: rec.revision };
  }

  create<T>(key: string, value: T): Promise<number> {
    return this.#write(key, value, (cur) => cur.json === undefined);
  }

  update<T>(key: string, value: T, revision: number): Promise<number> {
    return this.#write(key, value, (cur) => cur.json !== undefined && cur.revision === revision);
  }

  async delete(key: string, revision?: number): Promise<void> {
    await this.#write(key, undefined, (cur) =>
      revision === undefined ? true : cur.json !== undefined && cur.revision === revision,
    );
  }

  async close(): Promise<void> {
    this.#closed = true;
    await Promise.allSettled([...this.#locks.values()]);
  }

  /** `value` undefined writes a tombstone (a no-op when the key holds nothing). */
  async #write(key: string, value: unknown, allowed: (cur: Record) => boolean): Promise<number> {
    checkKey(key);
    const json = value === undefined ? undefined : JSON.stringify(value);
    if (value !== undefined && json === undefined) throw new TypeError(`Value of ${key} is not JSON`);
    return this.#locked(key, async () => {
      const cur = await this.#load(key);
      if (!allowed(cur)) throw new StoreConflictError(key);
      if (json === undefined && cur.json === undefined) return cur.revision;
      const next: Record = json === undefined ? { revision: cur.revision + 1 } : { revision: cur.revision + 1, json };
      await this.#persist(key, next);
      this.#cache.set(key, next);
      return next.revision;
    });
  }

  async #load(key: string): Promise<Record> {
    let rec = this.#cache.get(key);
    if (rec) return rec;
    try {
      const stored = JSON.parse(await readFile(this.#file(key), 'utf8')) as { revision: number; value?: unknown };
      rec = 'value' in stored ? { revision: stored.revision, json: JSON.stringify(stored.value) } : { revision: stored.revision };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      rec = { revision: 0 };
    }
    this.#cache.set(key, rec);
    return rec;
  }

  async #persist(key: string, rec: Record): Promise<void> {
    const text = rec.json === undefined ? `{"revision":${rec.revision}}` : `{"revision":${rec.revision},"value":${rec.json}}`;
    await writeFileAtomic(this.#file(key), text);
  }

  /** Case-insensitive file systems would merge `A` and `a`: upper-case letters become `^a`. */
  #file(key: string): string {
    return join(this.#dir, `${key.replace(/[A-Z]/g, (c) => `^${c.toLowerCase()}`)}.json`);
  }

  #locked<R>(key: string, fn: () => Promise<R>): Promise<R> {
    if (this.#closed) return Promise.reject(new Error('Session store is closed'));
    const prev = this.#locks.get(key) ?? Promise.resolve();
    const run = prev.then(fn, fn);
    const tail = run.catch(() => {});
    this.#locks.set(key, tail);
    void tail.then(() => {
      if (this.#locks.get(key) === tail) this.#locks.delete(key);
    });
    return run;
  }
}

function checkKey(key: string): string {
  if (!KEY.test(key)) throw new Error(`Invalid session store key ${JSON.stringify(key)}: allowed are [A-Za-z0-9_.=-]+`);
  return key;
}
