import { StoreError, type LedgerEntry, type PackageLedger } from '../ports.js';
import { StateDatabase } from './state-db.js';
import { openStateReader } from './state-schema.js';

const ID = /^[A-Za-z0-9_.=-]+$/;

/** Entries `list` reads per query: a session's ledger is read in pages, never all at once. */
const PAGE = 1000;

const COLUMNS = 'package_id, entity, rows, bytes, object_bytes';

/**
 * `PackageLedger` on the embedded state database (state-db.ts): one row of `ledger` per
 * package. An append is one insert per entry that is not there yet (appending is
 * idempotent), committed with every other write that came meanwhile; readers see it once
 * the commit is durable. Stored markers (`stored`) are counted per entity (`stored_count`)
 * in the transaction that writes them.
 */
export class SqliteLedger implements PackageLedger {
  readonly #db: StateDatabase;
  /** Set when the store opened its database itself (`open`): closing the store closes it. */
  readonly #owned: boolean;
  #closed = false;

  constructor(db: StateDatabase, opts: { owned?: boolean } = {}) {
    this.#db = db;
    this.#owned = opts.owned ?? false;
  }

  /** The entries of one session in the database at `path`, without the ledger (tests, tools; the owner may be running). */
  static peek(path: string, uploadUuid: string): LedgerEntry[] {
    const db = openStateReader(path);
    try {
      return db.prepare<[string], LedgerEntry>(`SELECT ${COLUMNS} FROM ledger WHERE upload = ?`).all(checkId(uploadUuid));
    } finally {
      db.close();
    }
  }

  async append(uploadUuid: string, entries: readonly LedgerEntry[]): Promise<void> {
    this.#check(uploadUuid);
    if (entries.length === 0) return;
    await this.#db.write({ t: 'ledger-append', upload: uploadUuid, entries: entries.map(entry) });
  }

  async get(uploadUuid: string, packageId: string): Promise<LedgerEntry | null> {
    this.#check(uploadUuid);
    return (await this.#db.read<LedgerEntry | undefined>('ledger.get', [uploadUuid, packageId])) ?? null;
  }

  /** One process's own database: a read is never stale, so `get` is confirmed as it is. */
  getConfirmed(uploadUuid: string, packageId: string): Promise<LedgerEntry | null> {
    return this.get(uploadUuid, packageId);
  }

  async *list(uploadUuid: string): AsyncIterable<LedgerEntry> {
    this.#check(uploadUuid);
    for (let after = ''; ; ) {
      const rows = await this.#db.read<LedgerEntry[]>('ledger.page', [uploadUuid, after, PAGE]);
      yield* rows;
      if (rows.length < PAGE) return;
      after = rows.at(-1)!.package_id;
    }
  }

  async markStored(uploadUuid: string, packageIds: readonly string[]): Promise<void> {
    this.#check(uploadUuid);
    if (packageIds.length === 0) return;
    await this.#db.write({ t: 'ledger-stored', upload: uploadUuid, ids: [...packageIds] });
  }

  async isStored(uploadUuid: string, packageId: string): Promise<boolean> {
    this.#check(uploadUuid);
    return (await this.#db.read('ledger.stored', [uploadUuid, packageId])) !== undefined;
  }

  async countStored(uploadUuid: string, packages: readonly { package_id: string; entity: string }[], summaryKey: string): Promise<void> {
    this.#check(uploadUuid);
    if (packages.length === 0) return;
    await this.#db.write({ t: 'ledger-stored', upload: uploadUuid, ids: packages.map((p) => p.package_id), entities: packages.map((p) => p.entity), guard: summaryKey });
  }

  async storedCounts(uploadUuid: string): Promise<Map<string, number>> {
    this.#check(uploadUuid);
    return new Map((await this.#db.read<{ entity: string; n: number }[]>('ledger.counts', [uploadUuid])).map((r) => [r.entity, r.n]));
  }

  async drop(uploadUuid: string): Promise<void> {
    this.#check(uploadUuid);
    await this.#db.write({ t: 'ledger-drop', upload: uploadUuid });
  }

  /** A store on a database of its own at `path` (tests, tools); the service shares one database between its stores. */
  static async open(path: string): Promise<SqliteLedger> {
    return new SqliteLedger(await StateDatabase.open(path), { owned: true });
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#owned) await this.#db.close();
  }

  #check(uploadUuid: string): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Ledger is closed');
    checkId(uploadUuid);
  }
}

/** Only the entry's own fields travel to the writer. */
function entry(e: LedgerEntry): LedgerEntry {
  return { package_id: e.package_id, entity: e.entity, rows: e.rows, bytes: e.bytes, object_bytes: e.object_bytes };
}

function checkId(id: string): string {
  if (!ID.test(id)) throw new StoreError('STORE_INVALID_KEY', `Invalid upload_uuid ${JSON.stringify(id)}`);
  return id;
}
