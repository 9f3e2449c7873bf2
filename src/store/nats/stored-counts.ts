/**
 * The ledger's own count of stored packages on NATS (`PackageLedger.countStored` and
 * `storedCounts`), for servers with atomic batches (2.12+).
 *
 * A package's marker (`<upload_uuid>.<package_id>.stored`) and its session's counts
 * (`<upload_uuid>.=.counts`, `{entities: {entity: n}}`) live in the ledger's bucket and are
 * written together, as one atomic batch: the counts by compare-and-set on the revision last
 * written or read, each marker on "no message yet" (expected last subject sequence 0). So a
 * package is counted exactly when its marker exists, in one durable step, without the three
 * steps and the `marking` set the session-store count needs (session/stored-counts.ts).
 *
 * Group commit: the counts asked for while a batch is out go together in the next one, for
 * every session (one set of syncs for all: about four, against two or three per package
 * counted one by one). A batch refused as a whole (a marker that exists: a package delivered
 * again; a count written by another uploader) is done again session by session, the careful
 * way: the counts and each package's marker read from the stream leader first, packages
 * already marked left out. A batch whose answer was lost is found the same way (its markers
 * are there).
 *
 * The first count of a session checks that its summary exists and is not deleted (no count
 * for a session a delete's clean-up may have dropped already), and takes over the count that
 * an earlier version kept in the session store (`stored.<upload_uuid>`, with its `marking`):
 * the packages in `marking` are counted and get their markers in the same batch.
 */
import type { KV } from 'nats';
import { storedCountKey } from '../keys.js';
import { readForAnswer, type SessionStore } from '../ports.js';
import { answerSoon, directGet, LastRead, readJson, withRetry, type NatsContext } from './connection.js';
import { publishAtomic, type GroupMessage } from './group-publisher.js';

/** What an earlier version wrote to the session store: counted packages, those in `marking` included. */
interface SessionStoreCounts {
  entities: Record<string, number>;
  marking: Record<string, string>;
}

interface Counts {
  entities: Record<string, number>;
}

interface Package {
  package_id: string;
  entity: string;
}

interface Want {
  uploadUuid: string;
  packages: readonly Package[];
  summaryKey: string;
  resolve: () => void;
  reject: (err: unknown) => void;
}

/** A session's counts as last written or read: revision 0 for none yet (`seed` then holds what an earlier version counted). */
interface Known {
  counts: Counts;
  revision: number;
  /** Packages an earlier version counted in `marking`, whose markers go with the first batch. */
  seed?: readonly string[];
}

/**
 * A batch waits up to `LINGER_MS` for this many packages: the counts of one uploader's
 * deliveries in flight (`storage.uploaderConcurrency`, 8 by default) go together. Nobody but
 * the ack waits for a count, and each batch costs about three syncs of its staging: 20 ms
 * instead of 5 took the ledger's fsyncs per package from 1.27–1.40 to 0.84–0.96 with
 * `always`, at the same rates (bench/results/HISTORY.md).
 */
const LINGER_UNTIL_PACKAGES = 8;
const LINGER_MS = 20;
/** At most this many messages per batch (the server's limit is 1,000). */
const BATCH_MAX_MESSAGES = 256;
const MAX_ATTEMPTS = 32;
/** Sessions whose counts are remembered as written (the least recently written go first). */
const REMEMBERED_SESSIONS = 1024;

export class NatsStoredCounts {
  readonly #ctx: NatsContext;
  readonly #kv: KV;
  readonly #bucket: string;
  readonly #stream: string;
  readonly #sessions: SessionStore;
  readonly #retryMs: number;
  readonly #direct: boolean;
  #waiting: Want[] = [];
  #busy = false;
  /** Ends a linger early (enough packages came). */
  #lingering: (() => void) | undefined;
  /** Counts as this instance last wrote or read them: a batch's compare-and-set starts from here. */
  readonly #known = new Map<string, Known>();
  /** What the answers last saw of each session's counts (`answerSoon`: never older than it). */
  readonly #seen = new LastRead<{ seq: number; counts: Counts | null }>(4096);
  /** Batches sent, and the sessions that had to go the careful way: what the tests read. */
  readonly stats = { batches: 0, careful: 0 };

  constructor(ctx: NatsContext, opts: { kv: KV; bucket: string; sessions: SessionStore; retryMs: number; direct: boolean }) {
    this.#ctx = ctx;
    this.#kv = opts.kv;
    this.#bucket = opts.bucket;
    this.#stream = `KV_${opts.bucket}`;
    this.#sessions = opts.sessions;
    this.#retryMs = opts.retryMs;
    this.#direct = opts.direct;
  }

  count(uploadUuid: string, packages: readonly Package[], summaryKey: string): Promise<void> {
    return new Promise((resolve, reject) => {
      this.#waiting.push({ uploadUuid, packages, summaryKey, resolve, reject });
      void this.#pump();
    });
  }

  /** Stored packages per entity, as answers read them (any replica; see `NatsSessionStore.getRecent`). */
  async perEntity(uploadUuid: string): Promise<Map<string, number>> {
    const subject = this.#subject(countsKey(uploadUuid));
    const what = `Stored counts of ${uploadUuid}`;
    // Read again while what arrives does not parse (`readJson`).
    const fresh = withRetry(this.#ctx, this.#retryMs, () =>
      this.#direct
        ? directGet(this.#ctx, this.#stream, { last_by_subj: subject }, this.#retryMs).then((msg) =>
            msg ? { seq: msg.seq, counts: readJson<Counts>(msg.data, what) } : { seq: 0, counts: null },
          )
        : this.#kv.get(countsKey(uploadUuid)).then((e) => (e && e.operation === 'PUT' ? { seq: e.revision, counts: readJson<Counts>(e.value, what) } : { seq: 0, counts: null })),
    );
    const seen = fresh.then((got) => {
      const before = this.#seen.peek(uploadUuid);
      const newer = before && before.seq > got.seq ? before : got;
      this.#seen.set(uploadUuid, newer);
      return newer;
    });
    const { counts } = await answerSoon(seen, () => this.#seen.recent(uploadUuid));
    if (counts) return new Map(Object.entries(counts.entities));
    // Not counted here yet: what an earlier version counted in the session store, if anything.
    const old = (await readForAnswer<SessionStoreCounts>(this.#sessions, storedCountKey(uploadUuid)))?.value;
    return new Map(Object.entries(seedCounts(old).entities));
  }

  /**
   * The session's counts were purged with its ledger (`drop`, after a delete): what this
   * instance knew of them goes (an answer never gives them back). Another instance may answer
   * them for `ANSWER_STALE_MS` at most, for a session whose status is 404 by then.
   */
  forget(uploadUuid: string): void {
    this.#known.delete(uploadUuid);
    this.#seen.delete(uploadUuid);
  }

  async #pump(): Promise<void> {
    if (this.#busy) {
      if (this.#waitingPackages() >= LINGER_UNTIL_PACKAGES) this.#lingering?.();
      return;
    }
    this.#busy = true;
    try {
      while (this.#waiting.length > 0) {
        // A batch costs about four syncs whatever its size: a few more packages are worth a wait.
        if (this.#waitingPackages() < LINGER_UNTIL_PACKAGES) {
          await new Promise<void>((resolve) => {
            const timer = setTimeout(resolve, LINGER_MS);
            this.#lingering = () => {
              clearTimeout(timer);
              resolve();
            };
          });
          this.#lingering = undefined;
        }
        await this.#round(this.#take());
      }
    } finally {
      this.#busy = false;
    }
  }

  #waitingPackages(): number {
    let n = 0;
    for (const w of this.#waiting) n += w.packages.length;
    return n;
  }

  /** The waiting counts, up to about a batch's worth of messages. */
  #take(): Want[] {
    let messages = 0;
    let n = 0;
    while (n < this.#waiting.length && (n === 0 || messages + this.#waiting[n]!.packages.length + 1 <= BATCH_MAX_MESSAGES)) {
      messages += this.#waiting[n]!.packages.length + 1;
      n++;
    }
    return this.#waiting.splice(0, n);
  }

  async #round(wants: Want[]): Promise<void> {
    const bySession = new Map<string, Want[]>();
    for (const w of wants) bySession.set(w.uploadUuid, [...(bySession.get(w.uploadUuid) ?? []), w]);
    const messages: GroupMessage[] = [];
    const sent: { uploadUuid: string; wants: Want[]; next: Counts; at: number }[] = [];
    const careful: [string, Want[]][] = [];
    for (const [uploadUuid, group] of bySession) {
      try {
        const known = this.#known.get(uploadUuid) ?? (await this.#load(uploadUuid, group[0]!.summaryKey));
        if (!known) {
          for (const w of group) w.resolve();
          continue;
        }
        // Assumed unmarked (a first delivery): a marker that exists refuses the batch, and the careful way sorts it out.
        const fresh = unique(group).filter((p) => !known.seed?.includes(p.package_id));
        if (fresh.length === 0 && !known.seed?.length) {
          for (const w of group) w.resolve();
          continue;
        }
        const next = counted(known.counts, fresh);
        sent.push({ uploadUuid, wants: group, next, at: messages.length });
        messages.push(...this.#messages(uploadUuid, known, next, fresh));
      } catch (err) {
        for (const w of group) w.reject(err);
      }
    }
    if (messages.length === 0) return;
    try {
      const first = await publishAtomic(this.#ctx, this.#stream, messages);
      this.stats.batches++;
      for (const s of sent) {
        this.#remember(s.uploadUuid, { counts: s.next, revision: first + s.at });
        for (const w of s.wants) w.resolve();
      }
    } catch {
      for (const s of sent) {
        this.#known.delete(s.uploadUuid);
        careful.push([s.uploadUuid, s.wants]);
      }
    }
    await Promise.all(careful.map(([uploadUuid, group]) => this.#careful(uploadUuid, group)));
  }

  /** One session alone: everything read from the stream leader first, packages already marked left out. */
  async #careful(uploadUuid: string, wants: Want[]): Promise<void> {
    this.stats.careful++;
    try {
      const packages = unique(wants);
      for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
        const known = await this.#load(uploadUuid, wants[0]!.summaryKey);
        if (!known) break;
        const marked = await Promise.all(packages.map((p) => this.#isMarked(uploadUuid, p.package_id)));
        const fresh = packages.filter((p, i) => !marked[i] && !known.seed?.includes(p.package_id));
        if (fresh.length === 0 && !known.seed?.length) break;
        const next = counted(known.counts, fresh);
        try {
          const first = await publishAtomic(this.#ctx, this.#stream, this.#messages(uploadUuid, known, next, fresh));
          this.#remember(uploadUuid, { counts: next, revision: first });
          break;
        } catch {
          // Lost to another writer, or the answer was lost: read again.
          if (attempt === MAX_ATTEMPTS - 1) throw new Error(`Stored count of ${uploadUuid}: too much contention`);
        }
      }
      for (const w of wants) w.resolve();
    } catch (err) {
      for (const w of wants) w.reject(err);
    }
  }

  /** The batch's messages of one session: its counts first (compare-and-set), then a marker per package counted now. */
  #messages(uploadUuid: string, known: Known, next: Counts, fresh: readonly Package[]): GroupMessage[] {
    return [
      { subject: this.#subject(countsKey(uploadUuid)), data: Buffer.from(JSON.stringify(next)), lastSubjectSequence: known.revision },
      ...fresh.map((p) => ({ subject: this.#subject(`${uploadUuid}.${p.package_id}.stored`), data: MARKER, lastSubjectSequence: 0 })),
      // An earlier version's `marking`: counted already; a marker that may exist is written again.
      ...(known.seed ?? []).map((id) => ({ subject: this.#subject(`${uploadUuid}.${id}.stored`), data: MARKER })),
    ];
  }

  /** The session's counts from the stream leader; without any, the summary's check and an earlier version's counts. Null: the session is gone. */
  async #load(uploadUuid: string, summaryKey: string): Promise<Known | null> {
    const read = await withRetry(this.#ctx, this.#retryMs, async () => {
      const e = await this.#kv.get(countsKey(uploadUuid));
      return { entry: e, counts: e && e.operation === 'PUT' ? readJson<Counts>(e.value, `Stored counts of ${uploadUuid}`) : null };
    });
    const { entry } = read;
    if (entry && read.counts) {
      const known = { counts: read.counts, revision: entry.revision };
      this.#remember(uploadUuid, known);
      return known;
    }
    const summary = await this.#sessions.get<{ deleted?: true }>(summaryKey);
    if (!summary || summary.value.deleted) return null;
    const old = (await this.#sessions.get<SessionStoreCounts>(storedCountKey(uploadUuid)))?.value;
    // A tombstone or purge of the counts key is a revision too: compare-and-set against it.
    return { counts: seedCounts(old), revision: entry?.revision ?? 0, seed: Object.keys(old?.marking ?? {}) };
  }

  async #isMarked(uploadUuid: string, packageId: string): Promise<boolean> {
    const entry = await withRetry(this.#ctx, this.#retryMs, () => this.#kv.get(`${uploadUuid}.${packageId}.stored`));
    return entry !== null && entry.operation === 'PUT';
  }

  #remember(uploadUuid: string, known: Known): void {
    this.#known.delete(uploadUuid);
    this.#known.set(uploadUuid, { counts: known.counts, revision: known.revision });
    if (this.#known.size > REMEMBERED_SESSIONS) this.#known.delete(this.#known.keys().next().value!);
  }

  #subject(key: string): string {
    return `$KV.${this.#bucket}.${key}`;
  }
}

const MARKER = Buffer.from('1');

/** The counts key of a session: `=` is no package id's character, so it never meets a marker or an entry. */
export function countsKey(uploadUuid: string): string {
  return `${uploadUuid}.=.counts`;
}

/** What an earlier version counted, `marking` included. */
function seedCounts(old: SessionStoreCounts | undefined): Counts {
  const entities = { ...(old?.entities ?? {}) };
  for (const entity of Object.values(old?.marking ?? {})) entities[entity] = (entities[entity] ?? 0) + 1;
  return { entities };
}

function counted(counts: Counts, fresh: readonly Package[]): Counts {
  const entities = { ...counts.entities };
  for (const p of fresh) entities[p.entity] = (entities[p.entity] ?? 0) + 1;
  return { entities };
}

/** The packages of `wants`, each once. */
function unique(wants: readonly Want[]): Package[] {
  const out = new Map<string, Package>();
  for (const w of wants) for (const p of w.packages) out.set(p.package_id, p);
  return [...out.values()];
}
