/**
 * How many of a session's packages are in object storage, kept as the uploader stores them,
 * so that status reads a few numbers instead of folding the ledger.
 *
 * A ledger that counts its own markers (`countStored`: the embedded one, marker and count in
 * one transaction; the NATS one on servers with atomic batches, 2.12+, marker and count in one
 * batch) does it all in one write. Otherwise (NATS 2.10 and 2.11) the count lives in its own
 * session-store key (`stored.<upload_uuid>`), apart from the summary: the uploader (another
 * process on NATS) never contends with the gateway's writes of the summary. A package is
 * counted once however often it is delivered and stored (a put is repeated on redelivery),
 * by the same three steps that record a package (state.ts):
 * ```
 *  put ──> marking[id] = entity ──> ledger marker (idempotent) ──> entities[entity] += 1
 *        (compare-and-set; counted          │                      (id leaves marking once its marker
 *         from here on)                     │                       is durable: in the session's next
 *                                           │                       step 1, or alone when counts pause)
 * ```
 * A package is counted exactly when it is in `marking` or has its ledger marker; the record is
 * read first and the ledger second, so a delivery that finds neither really is the first (a
 * compare-and-set on the revision it read proves nobody counted it meanwhile). The package is
 * acked only after step 2, so a crash before leaves it to a redelivery, which completes the
 * steps without counting it again; `marking` holds packages in hand and marked ones waiting
 * for step 3 (a crash may leave a few there for good: counted, as they should be).
 * Only packages the session recorded are stored (recovery.ts), so the count never exceeds
 * the recorded packages.
 */
import { errors } from '../errors.js';
import { sessionKey, storedCountKey } from '../store/keys.js';
import { isStoreConflict, readForAnswer, type PackageLedger, type SessionStore, type Versioned } from '../store/ports.js';

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
  /** Resolves once the writes of every count are done (tidying included). */
  flush(): Promise<void>;
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
    flush: async () => {},
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
/** Sessions whose record `StoredPackages` remembers as it wrote it (the least recently written go first). */
const REMEMBERED_SESSIONS = 1024;
/** How long a session's marked packages wait for its next count to fold them before they get a write alone. */
const FOLD_AFTER_MS = 1000;

interface Waiting {
  pkg: StoredPackage;
  resolve: () => void;
  reject: (err: unknown) => void;
}

/** One session's counts in this instance: written one group at a time. */
interface SessionQueue {
  waiting: Waiting[];
  /** The run writing this session's groups; null when none runs. */
  run: Promise<void> | null;
  /** Packages this instance put in `marking` and then marked in the ledger, not yet folded: id → entity. */
  marked: Map<string, string>;
  /** Ends the run's wait for another count: true, one came; false, fold now. */
  wake: ((arrived: boolean) => void) | null;
  /** `flush` was called: fold without waiting. */
  hurry: boolean;
}

/**
 * The uploader's side: `count` after each put, before the ack. The packages of one session
 * stored while a count is written go together (one compare-and-set for all of them). Step 3
 * is no write of its own while counts keep coming: the marked packages leave `marking` in the
 * next group's compare-and-set; only once the session's counts pause for `FOLD_AFTER_MS` do
 * they get a write alone. A count resolves after step 2, so a crash before the fold leaves
 * them in `marking`, counted, as a crash after step 2 always could.
 */
export class StoredPackages implements StoredCounter {
  readonly #sessions: SessionStore;
  readonly #ledger: PackageLedger;
  readonly #queues = new Map<string, SessionQueue>();
  /**
   * The record as this instance last wrote it, per session: the next compare-and-set starts
   * from it instead of reading the record first (on NATS a read from the stream leader). A
   * record written since by someone else fails that compare-and-set, and the step reads it
   * then; so the cache saves reads and never decides anything.
   */
  readonly #written = new Map<string, Versioned<StoredCounts>>();

  constructor(deps: { sessions: SessionStore; ledger: PackageLedger }) {
    this.#sessions = deps.sessions;
    this.#ledger = deps.ledger;
  }

  count(pkg: StoredPackage): Promise<void> {
    return new Promise((resolve, reject) => {
      let q = this.#queues.get(pkg.upload_uuid);
      if (!q) {
        q = { waiting: [], run: null, marked: new Map(), wake: null, hurry: false };
        this.#queues.set(pkg.upload_uuid, q);
      }
      q.waiting.push({ pkg, resolve, reject });
      if (q.run) q.wake?.(true);
      else q.run = this.#run(pkg.upload_uuid, q);
    });
  }

  async perEntity(uploadUuid: string): Promise<Map<string, number>> {
    return storedPerEntity((await readForAnswer<StoredCounts>(this.#sessions, storedCountKey(uploadUuid)))?.value ?? null);
  }

  /** Folds every marked package now and resolves once every session's writes are done. */
  async flush(): Promise<void> {
    const runs = [...this.#queues.values()].map((q) => {
      q.hurry = true;
      q.wake?.(false);
      return q.run;
    });
    await Promise.all(runs);
  }

  async #run(uploadUuid: string, q: SessionQueue): Promise<void> {
    try {
      for (;;) {
        if (q.waiting.length === 0) {
          if (q.marked.size === 0 || !(await this.#wait(q))) break;
          continue;
        }
        const group = q.waiting.splice(0);
        const pkgs = new Map(group.map((w) => [w.pkg.package_id, w.pkg.entity]));
        try {
          if (await this.#fence(uploadUuid, pkgs, q.marked)) {
            await this.#ledger.markStored(uploadUuid, [...pkgs.keys()]);
            for (const [id, entity] of pkgs) q.marked.set(id, entity);
          }
          for (const w of group) w.resolve();
        } catch (err) {
          for (const w of group) w.reject(err);
        }
      }
      // No count came: the marked packages leave `marking` in a write of their own. A failure
      // leaves them there, counted; the next count of the session folds what it marks itself.
      if (q.marked.size > 0) await this.#fold(uploadUuid, q.marked).catch(() => {});
    } finally {
      q.run = null;
      if (q.waiting.length > 0) q.run = this.#run(uploadUuid, q);
      else if (this.#queues.get(uploadUuid) === q) this.#queues.delete(uploadUuid);
    }
  }

  /** Waits up to `FOLD_AFTER_MS` for another count of the session: true if one came. */
  #wait(q: SessionQueue): Promise<boolean> {
    if (q.hurry) return Promise.resolve(false);
    return new Promise((resolve) => {
      const timer = setTimeout(() => q.wake?.(false), FOLD_AFTER_MS);
      timer.unref(); // an exit meanwhile leaves them in `marking`, counted
      q.wake = (arrived) => {
        clearTimeout(timer);
        q.wake = null;
        resolve(arrived);
      };
    });
  }

  /**
   * Step 1: every package neither in `marking` nor marked in the ledger joins `marking`, and
   * the packages of `marked` leave it for the per-entity counts, in one compare-and-set.
   * False: the session is gone.
   */
  async #fence(uploadUuid: string, pkgs: Map<string, string>, marked: Map<string, string>): Promise<boolean> {
    const key = storedCountKey(uploadUuid);
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const current = (attempt === 0 ? this.#written.get(uploadUuid) : undefined) ?? (await this.#read(uploadUuid));
      if (!current) {
        // The first count of the session: not for one that is gone (a delete's clean-up would not find it again).
        const summary = await this.#sessions.get<{ deleted?: true }>(sessionKey(uploadUuid));
        if (!summary || summary.value.deleted) return false;
      }
      const value = current?.value ?? { entities: {}, marking: {} };
      const unseen = [...pkgs].filter(([id]) => !(id in value.marking));
      // Read after the record: a marker written before this revision's `marking` lost the id is seen here.
      const isMarked = await Promise.all(unseen.map(([id]) => this.#ledger.isStored(uploadUuid, id)));
      const fresh = unseen.filter((_, i) => !isMarked[i]);
      if (fresh.length === 0) return true;
      const folded = fold(value, marked);
      const next: StoredCounts = { entities: folded.entities, marking: { ...folded.marking, ...Object.fromEntries(fresh) } };
      try {
        const revision = current ? await this.#sessions.update(key, next, current.revision) : await this.#sessions.create(key, next);
        this.#remember(uploadUuid, { value: next, revision });
        marked.clear();
        return true;
      } catch (err) {
        this.#written.delete(uploadUuid);
        if (!isStoreConflict(err)) throw err;
      }
    }
    throw errors.internal(new Error(`Stored count of ${uploadUuid}: too much contention`));
  }

  /** Step 3 alone: the packages of `marked` leave `marking` for the per-entity counts. */
  async #fold(uploadUuid: string, marked: Map<string, string>): Promise<void> {
    const key = storedCountKey(uploadUuid);
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const current = (attempt === 0 ? this.#written.get(uploadUuid) : undefined) ?? (await this.#read(uploadUuid));
      if (!current) return; // the session was deleted meanwhile
      const next = fold(current.value, marked);
      if (next === current.value) return;
      try {
        this.#remember(uploadUuid, { value: next, revision: await this.#sessions.update(key, next, current.revision) });
        marked.clear();
        return;
      } catch (err) {
        this.#written.delete(uploadUuid);
        if (!isStoreConflict(err)) throw err;
      }
    }
    throw errors.internal(new Error(`Stored count of ${uploadUuid}: too much contention`));
  }

  async #read(uploadUuid: string): Promise<Versioned<StoredCounts> | null> {
    this.#written.delete(uploadUuid);
    return this.#sessions.get<StoredCounts>(storedCountKey(uploadUuid));
  }

  #remember(uploadUuid: string, record: Versioned<StoredCounts>): void {
    this.#written.delete(uploadUuid);
    this.#written.set(uploadUuid, record);
    if (this.#written.size > REMEMBERED_SESSIONS) this.#written.delete(this.#written.keys().next().value!);
  }
}

/** `value` with the packages of `marked` still in its `marking` moved to the per-entity counts; `value` itself when none is. */
function fold(value: StoredCounts, marked: ReadonlyMap<string, string>): StoredCounts {
  const moving = [...marked.keys()].filter((id) => id in value.marking);
  if (moving.length === 0) return value;
  const marking = { ...value.marking };
  const entities = { ...value.entities };
  for (const id of moving) {
    const entity = marking[id]!;
    delete marking[id];
    entities[entity] = (entities[entity] ?? 0) + 1;
  }
  return { entities, marking };
}
