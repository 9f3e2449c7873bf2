/**
 * How many of a session's packages are in object storage, kept as the uploader stores them,
 * so that status reads a few numbers instead of folding the ledger.
 *
 * A ledger that counts its own markers (`countStored`, the embedded one: marker and count in
 * one transaction) does it all in one write. Otherwise (NATS) the count lives in its own
 * session-store key (`stored.<upload_uuid>`), apart from the summary: the uploader (another
 * process on NATS) never contends with the gateway's writes of the summary. A package is counted once however often it is delivered and stored (a put
 * is repeated on redelivery), by the same three steps that record a package (state.ts):
 * ```
 *  put ──> marking[id] = entity ──> ledger marker (idempotent) ──> entities[entity] += 1
 *        (compare-and-set; counted          │                      (compare-and-set; id leaves
 *         from here on)                     │                       marking once the marker is durable)
 * ```
 * A package is counted exactly when it is in `marking` or has its ledger marker; the record is
 * read first and the ledger second, so a delivery that finds neither really is the first (a
 * compare-and-set on the revision it read proves nobody counted it meanwhile). The package is
 * acked only after the last step, so a crash anywhere leaves it to a redelivery, which
 * completes the steps without counting it again; `marking` holds only packages in hand.
 * Only packages the session recorded are stored (recovery.ts), so the count never exceeds
 * the recorded packages.
 */
import { errors } from '../errors.js';
import { sessionKey, storedCountKey } from '../store/keys.js';
import { isStoreConflict, type PackageLedger, type SessionStore } from '../store/ports.js';

/** The stored record `stored.<upload_uuid>`. */
export interface StoredCounts {
  /** Per entity: stored packages whose ledger marker is durable. */
  entities: Record<string, number>;
  /** Stored packages whose marker is being written: package id → entity. Already counted. */
  marking: Record<string, string>;
}

/** Counts the packages the uploader stored, each once, before it acks them; and reads the counts. */
export interface StoredCounter {
  /** Resolves once the package is counted, durably and once; rejects when the store failed (deliver it again). */
  count(pkg: StoredPackage): Promise<void>;
  /** Stored packages per entity: every package whose `count` resolved, perhaps some whose count is under way. */
  perEntity(uploadUuid: string): Promise<Map<string, number>>;
}

/** The ledger's own count where it keeps one, else `StoredPackages`. */
export function storedCounter(deps: { sessions: SessionStore; ledger: PackageLedger }): StoredCounter {
  const { ledger } = deps;
  if (!ledger.countStored || !ledger.storedCounts) return new StoredPackages(deps);
  const countStored = ledger.countStored.bind(ledger);
  const storedCounts = ledger.storedCounts.bind(ledger);
  return {
    count: (pkg) => countStored(pkg.upload_uuid, [{ package_id: pkg.package_id, entity: pkg.entity }], sessionKey(pkg.upload_uuid)),
    perEntity: (uploadUuid) => storedCounts(uploadUuid),
  };
}

/** Stored packages per entity, `marking` included. */
function storedPerEntity(c: StoredCounts | null): Map<string, number> {
  const out = new Map<string, number>(Object.entries(c?.entities ?? {}));
  for (const entity of Object.values(c?.marking ?? {})) out.set(entity, (out.get(entity) ?? 0) + 1);
  return out;
}

export interface StoredPackage {
  upload_uuid: string;
  package_id: string;
  entity: string;
}

const MAX_CAS_ATTEMPTS = 32;

interface Waiting {
  pkg: StoredPackage;
  resolve: () => void;
  reject: (err: unknown) => void;
}

/**
 * The uploader's side: `count` after each put, before the ack. The packages of one session
 * stored while a count is written go together (one compare-and-set per step for all of them).
 */
export class StoredPackages implements StoredCounter {
  readonly #sessions: SessionStore;
  readonly #ledger: PackageLedger;
  readonly #queues = new Map<string, { waiting: Waiting[]; running: boolean }>();

  constructor(deps: { sessions: SessionStore; ledger: PackageLedger }) {
    this.#sessions = deps.sessions;
    this.#ledger = deps.ledger;
  }

  count(pkg: StoredPackage): Promise<void> {
    return new Promise((resolve, reject) => {
      let q = this.#queues.get(pkg.upload_uuid);
      if (!q) {
        q = { waiting: [], running: false };
        this.#queues.set(pkg.upload_uuid, q);
      }
      q.waiting.push({ pkg, resolve, reject });
      if (!q.running) void this.#run(pkg.upload_uuid, q);
    });
  }

  async perEntity(uploadUuid: string): Promise<Map<string, number>> {
    return storedPerEntity((await this.#sessions.get<StoredCounts>(storedCountKey(uploadUuid)))?.value ?? null);
  }

  async #run(uploadUuid: string, q: { waiting: Waiting[]; running: boolean }): Promise<void> {
    q.running = true;
    try {
      while (q.waiting.length > 0) {
        const group = q.waiting.splice(0);
        const pkgs = new Map(group.map((w) => [w.pkg.package_id, w.pkg.entity]));
        try {
          if (await this.#fence(uploadUuid, pkgs)) {
            await this.#ledger.markStored(uploadUuid, [...pkgs.keys()]);
            await this.#fold(uploadUuid, pkgs);
          }
          for (const w of group) w.resolve();
        } catch (err) {
          for (const w of group) w.reject(err);
        }
      }
    } finally {
      q.running = false;
      if (this.#queues.get(uploadUuid) === q) this.#queues.delete(uploadUuid);
    }
  }

  /** Step 1: every package neither in `marking` nor marked in the ledger joins `marking`. False: the session is gone. */
  async #fence(uploadUuid: string, pkgs: Map<string, string>): Promise<boolean> {
    const key = storedCountKey(uploadUuid);
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const current = await this.#sessions.get<StoredCounts>(key);
      if (!current) {
        // The first count of the session: not for one that is gone (a delete's clean-up would not find it again).
        const summary = await this.#sessions.get<{ deleted?: true }>(sessionKey(uploadUuid));
        if (!summary || summary.value.deleted) return false;
      }
      const value = current?.value ?? { entities: {}, marking: {} };
      const unseen = [...pkgs].filter(([id]) => !(id in value.marking));
      // Read after the record: a marker written before this revision's `marking` lost the id is seen here.
      const marked = await Promise.all(unseen.map(([id]) => this.#ledger.isStored(uploadUuid, id)));
      const fresh = unseen.filter((_, i) => !marked[i]);
      if (fresh.length === 0) return true;
      const next: StoredCounts = { entities: value.entities, marking: { ...value.marking, ...Object.fromEntries(fresh) } };
      try {
        if (current) await this.#sessions.update(key, next, current.revision);
        else await this.#sessions.create(key, next);
        return true;
      } catch (err) {
        if (!isStoreConflict(err)) throw err;
      }
    }
    throw errors.internal(new Error(`Stored count of ${uploadUuid}: too much contention`));
  }

  /** Step 3: the marked packages leave `marking` for the per-entity counts. */
  async #fold(uploadUuid: string, pkgs: Map<string, string>): Promise<void> {
    const key = storedCountKey(uploadUuid);
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const current = await this.#sessions.get<StoredCounts>(key);
      if (!current) return; // the session was deleted meanwhile
      const marking = { ...current.value.marking };
      const entities = { ...current.value.entities };
      let moved = 0;
      for (const id of pkgs.keys()) {
        const entity = marking[id];
        if (entity === undefined) continue;
        delete marking[id];
        entities[entity] = (entities[entity] ?? 0) + 1;
        moved++;
      }
      if (moved === 0) return;
      try {
        await this.#sessions.update(key, { entities, marking } satisfies StoredCounts, current.revision);
        return;
      } catch (err) {
        if (!isStoreConflict(err)) throw err;
      }
    }
    throw errors.internal(new Error(`Stored count of ${uploadUuid}: too much contention`));
  }
}
