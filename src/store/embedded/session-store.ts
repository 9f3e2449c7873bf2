import { KEY_PREFIX, StoreConflictError, StoreError, type Listed, type SessionStore, type Versioned } from '../ports.js';
import { StateDatabase } from './state-db.js';
import { openStateReader } from './state-schema.js';

const KEY = /^[A-Za-z0-9_.=-]+$/;

/** A key with an empty token (a leading, trailing or doubled dot): never listed (ports.ts). */
const EMPTY_TOKEN = /^\.|\.\.|\.$/;

/** Keys `list` reads per query. */
const LIST_PAGE = 500;

/**
 * `SessionStore` on the embedded state database (state-db.ts), for one process: a key is a
 * row of `kv`; compare-and-set is decided in the writer's transaction, in arrival order. A
 * write resolves, and its value becomes readable, once its commit is durable; a write that
 * failed leaves the old value, on disk and to every reader.
 */
export class SqliteSessionStore implements SessionStore {
  /** The database belongs to this process alone (DATA_DIR's lock, data-dir.ts). */
  readonly capabilities = { singleProcess: true } as const;
  readonly #db: StateDatabase;
  /** Set when the store opened its database itself (`open`): closing the store closes it. */
  readonly #owned: boolean;
  #closed = false;

  constructor(db: StateDatabase, opts: { owned?: boolean } = {}) {
    this.#db = db;
    this.#owned = opts.owned ?? false;
  }

  /** Reads one key from the database at `path` without the store (tests, tools; the owner may be running). */
  static peek<T>(path: string, key: string): Versioned<T> | null {
    const db = openStateReader(path);
    try {
      const row = db.prepare<[string], { revision: number; value: string }>('SELECT revision, value FROM kv WHERE key = ?').get(checkKey(key));
      return row ? { value: JSON.parse(row.value) as T, revision: row.revision } : null;
    } finally {
      db.close();
    }
  }

  async get<T>(key: string): Promise<Versioned<T> | null> {
    this.#check();
    const row = await this.#db.read<{ revision: number; value: string } | undefined>('kv.get', [checkKey(key)]);
    return row ? { value: JSON.parse(row.value) as T, revision: row.revision } : null;
  }

  /** `get`: one process, and a read sees every write that resolved. */
  getConfirmed<T>(key: string): Promise<Versioned<T> | null> {
    return this.get<T>(key);
  }

  /** The port's listing (store/ports.ts): the keys in order, a page per query, each page as of its query. */
  async *list<T>(prefix: string): AsyncIterable<Listed<T>> {
    for await (const row of this.#range<{ key: string; revision: number; value: string }>(prefix, 'kv.page')) yield { key: row.key, value: JSON.parse(row.value) as T, revision: row.revision };
  }

  /** The port's key listing: `list` without the values. */
  async *keys(prefix: string): AsyncIterable<string> {
    for await (const row of this.#range<{ key: string }>(prefix, 'kv.keys')) yield row.key;
  }

  /** The rows of keys under `prefix`, a page of `query` at a time. */
  async *#range<R extends { key: string }>(prefix: string, query: 'kv.page' | 'kv.keys'): AsyncIterable<R> {
    this.#check();
    if (!KEY_PREFIX.test(prefix)) throw new StoreError('STORE_INVALID_KEY', `Invalid session store key prefix ${JSON.stringify(prefix)}`);
    // Every key under `prefix` sorts before the prefix with its last character raised ('.' + 1 is '/').
    const end = prefix === '' ? '\u{10FFFF}' : `${prefix.slice(0, -1)}/`;
    for (let after = prefix; ; ) {
      const rows = await this.#db.read<R[]>(query, [after, end, LIST_PAGE]);
      for (const row of rows) if (!EMPTY_TOKEN.test(row.key)) yield row;
      if (rows.length < LIST_PAGE) return;
      after = rows.at(-1)!.key;
    }
  }

  create<T>(key: string, value: T): Promise<number> {
    return this.#write(key, (json) => ({ t: 'create', key, json }), value);
  }

  update<T>(key: string, value: T, revision: number): Promise<number> {
    return this.#write(key, (json) => ({ t: 'update', key, json, revision }), value);
  }

  async delete(key: string, revision?: number): Promise<void> {
    this.#check();
    const outcome = await this.#db.write({ t: 'delete', key: checkKey(key), revision });
    if (outcome.conflict) throw new StoreConflictError(key);
  }

  /** A store on a database of its own at `path` (tests, tools); the service shares one database between its stores. */
  static async open(path: string): Promise<SqliteSessionStore> {
    return new SqliteSessionStore(await StateDatabase.open(path), { owned: true });
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#owned) await this.#db.close();
  }

  async #write(key: string, op: (json: string) => Parameters<StateDatabase['write']>[0], value: unknown): Promise<number> {
    this.#check();
    checkKey(key);
    const json = JSON.stringify(value);
    if (json === undefined) throw new TypeError(`Value of ${key} is not JSON`);
    const outcome = await this.#db.write(op(json));
    if (outcome.conflict) throw new StoreConflictError(key);
    return outcome.revision!;
  }

  #check(): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Session store is closed');
  }
}

function checkKey(key: string): string {
  if (!KEY.test(key)) throw new StoreError('STORE_INVALID_KEY', `Invalid session store key ${JSON.stringify(key)}: allowed are [A-Za-z0-9_.=-]+`);
  return key;
}
