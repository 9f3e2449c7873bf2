/**
 * The listing of a client's sessions (`GET /api/v1/uploading/sessions`): an index of one key
 * per session a client created (`clientSessionKey`, written by `initialize`, its creation time
 * and id in the key), paged newest first by key names alone; and the one-time indexing of the
 * sessions of earlier versions, with the index entries they wrote (`legacyClientSessionKey`,
 * the creation time in the value) written again as the keys of now.
 */
import { clientSessionKey, clientSessionsPrefix, legacyClientSessionKey, sessionKey } from '../store/keys.js';
import { isStoreConflict, readForAnswer, type SessionStore } from '../store/ports.js';
import { fromStored, sessionCounts, type ClientRef, type ClientSessionEntry, type SessionCounts, type SessionRecord, type SessionStatus } from './state.js';
import type { StoredCounter } from './stored-counts.js';
import { UPLOAD_UUID } from './summaries.js';

/** Set once the sessions of versions without the listing's index are indexed (`indexEarlierSessions`). */
const LISTING_INDEXED = 'listing.indexed';
/** Set once the index entries of versions that kept the creation time in the value are written again (`indexEarlierSessions`). */
const LISTING_ORDERED = 'listing.ordered';
/** Values of earlier versions' index entries a listing reads at once. */
const LEGACY_READS = 32;
/** The tail of a `clientSessionKey` after the client's prefix: creation time (ms, 15 digits) and id. */
const ORDERED_TAIL = /^(\d{15})\.([0-9a-f-]{36})$/;

/** Where a page of `listSessions` ended: the next one starts after it. */
export interface SessionPosition {
  created_at: string;
  upload_uuid: string;
}

/** One session of `GET /api/v1/uploading/sessions`. */
export interface SessionListItem {
  upload_uuid: string;
  session_status: SessionStatus;
  created_at: string;
  totals: SessionCounts;
}

/** Newest first: `created_at` descending, then `upload_uuid` descending (negative: `a` comes first). */
function newestFirst(a: SessionPosition, b: SessionPosition): number {
  if (a.created_at !== b.created_at) return a.created_at > b.created_at ? -1 : 1;
  return a.upload_uuid === b.upload_uuid ? 0 : a.upload_uuid > b.upload_uuid ? -1 : 1;
}

export class SessionListing {
  constructor(
    private readonly deps: { readonly sessions: SessionStore },
    private readonly stored: StoredCounter,
    private readonly now: () => number,
  ) {}

  /**
   * The client's sessions, newest first (`created_at`, then `upload_uuid`, both descending),
   * `limit` of them after `after` (a position a previous page ended at). Deleted sessions are
   * left out. Reads the names of the client's index keys (one per session it created and did
   * not delete: one request, no value read), then the summary and stored count of each session
   * on the page; an entry an earlier version wrote, until housekeeping writes it again, is read.
   */
  async list(client: ClientRef, limit: number, after: SessionPosition | null): Promise<{ sessions: SessionListItem[]; next: SessionPosition | null }> {
    const index = await this.#index(client.id);
    index.sort(newestFirst);
    let i = after ? index.findIndex((e) => newestFirst(after, e) < 0) : 0;
    if (i < 0) i = index.length;
    const sessions: SessionListItem[] = [];
    let last: SessionPosition | null = null;
    while (sessions.length < limit && i < index.length) {
      const chunk = index.slice(i, i + limit - sessions.length);
      i += chunk.length;
      const read = await Promise.all(
        chunk.map(async (e) => {
          if (!UPLOAD_UUID.test(e.upload_uuid)) return null;
          const [summary, stored] = await Promise.all([
            readForAnswer<SessionRecord>(this.deps.sessions, sessionKey(e.upload_uuid)),
            this.stored.perEntity(e.upload_uuid),
          ]);
          return { e, summary: summary ? fromStored(summary.value) : null, stored };
        }),
      );
      for (const got of read) {
        if (!got) continue;
        const { e, summary, stored } = got;
        if (!summary || summary.deleted || summary.client_id !== client.id) continue;
        sessions.push({
          upload_uuid: summary.upload_uuid,
          session_status: summary.status,
          created_at: summary.created_at,
          totals: sessionCounts(summary, stored).totals,
        });
        last = { created_at: e.created_at, upload_uuid: e.upload_uuid };
      }
    }
    return { sessions, next: sessions.length === limit && i < index.length ? last : null };
  }

  /** The client's index entries, each session once (an earlier version's entry and its rewrite may both be there a moment). */
  async #index(clientId: string): Promise<ClientSessionEntry[]> {
    const prefix = clientSessionsPrefix(clientId);
    const entries = new Map<string, ClientSessionEntry>();
    const legacy: string[] = [];
    for await (const key of this.deps.sessions.keys(prefix)) {
      const tail = key.slice(prefix.length);
      const ordered = ORDERED_TAIL.exec(tail);
      if (ordered) entries.set(ordered[2]!, { upload_uuid: ordered[2]!, created_at: new Date(Number(ordered[1])).toISOString() });
      else if (UPLOAD_UUID.test(tail)) legacy.push(key);
    }
    for (let i = 0; i < legacy.length; i += LEGACY_READS) {
      const read = await Promise.all(legacy.slice(i, i + LEGACY_READS).map((key) => readForAnswer<ClientSessionEntry>(this.deps.sessions, key)));
      for (const got of read) if (got && !entries.has(got.value.upload_uuid)) entries.set(got.value.upload_uuid, got.value);
    }
    return [...entries.values()];
  }

  /**
   * Once per store, by whichever gateway's housekeeping comes first (several at once write
   * the same entries: create-if-absent): sessions created by a version without the listing's
   * index get their entries (`LISTING_INDEXED`; reads every session summary once), and the
   * entries of versions that kept the creation time in the value are written again as
   * `clientSessionKey` and removed (`LISTING_ORDERED`). Returns how many entries it created.
   */
  async indexEarlierSessions(): Promise<number> {
    const { sessions } = this.deps;
    let created = 0;
    const index = async (clientId: string, entry: ClientSessionEntry) => {
      try {
        await sessions.create<ClientSessionEntry>(clientSessionKey(clientId, entry.upload_uuid, entry.created_at), entry);
        created++;
      } catch (err) {
        if (!isStoreConflict(err)) throw err;
      }
    };
    const done = async (flag: string) =>
      sessions.create(flag, { at: new Date(this.now()).toISOString() }).catch((err: unknown) => {
        if (!isStoreConflict(err)) throw err;
      });
    if (!(await sessions.get(LISTING_INDEXED))) {
      for await (const { value } of sessions.list<SessionRecord>('session.')) {
        if (value.deleted || !UPLOAD_UUID.test(value.upload_uuid)) continue;
        await index(value.client_id, { upload_uuid: value.upload_uuid, created_at: value.created_at });
      }
      await done(LISTING_INDEXED);
    }
    if (!(await sessions.get(LISTING_ORDERED))) {
      for await (const { key, value } of sessions.list<ClientSessionEntry>('sessions.')) {
        const hex = /^sessions\.([0-9a-f]*)\.([0-9a-f-]{36})$/.exec(key);
        if (!hex || !UPLOAD_UUID.test(hex[2]!)) continue;
        const clientId = Buffer.from(hex[1]!, 'hex').toString('utf8');
        await index(clientId, value);
        await sessions.delete(key);
      }
      await done(LISTING_ORDERED);
    }
    return created;
  }
}

/**
 * Removes a deleted session's index entries (session/clean-up.ts): the entry of its creation
 * time when known, else whichever of the client's entries names it; and the entry an earlier
 * version wrote.
 */
export async function forgetListingEntries(sessions: SessionStore, clientId: string, uploadUuid: string, createdAt: string | undefined): Promise<void> {
  const keys: string[] = [];
  if (createdAt !== undefined) keys.push(clientSessionKey(clientId, uploadUuid, createdAt));
  else for await (const key of sessions.keys(clientSessionsPrefix(clientId))) if (key.endsWith(`.${uploadUuid}`)) keys.push(key);
  // Read first: a delete writes a marker on NATS, a durable write, and only a version before the ordered keys wrote this one.
  const legacy = legacyClientSessionKey(clientId, uploadUuid);
  if (!keys.includes(legacy) && (await sessions.get(legacy))) keys.push(legacy);
  for (const key of keys) await sessions.delete(key);
}
