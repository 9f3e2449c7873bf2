/**
 * The listing of a client's sessions (`GET /api/v1/uploading/sessions`): an index of one key
 * per session a client created (`clientSessionKey`, written by `initialize`), read whole and
 * paged newest first; and the one-time indexing of the sessions of earlier versions.
 */
import { clientSessionKey, clientSessionsPrefix, sessionKey } from '../store/keys.js';
import { isStoreConflict, readForAnswer, type SessionStore } from '../store/ports.js';
import { fromStored, sessionCounts, type ClientRef, type ClientSessionEntry, type SessionCounts, type SessionRecord, type SessionStatus } from './state.js';
import type { StoredCounter } from './stored-counts.js';
import { UPLOAD_UUID } from './summaries.js';

/** Set once the sessions of versions without the listing's index are indexed (`indexEarlierSessions`). */
const LISTING_INDEXED = 'listing.indexed';

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
   * left out. Reads the client's whole index (one key per session it ever created and did not
   * delete), then the summary and stored count of each session on the page.
   */
  async list(client: ClientRef, limit: number, after: SessionPosition | null): Promise<{ sessions: SessionListItem[]; next: SessionPosition | null }> {
    const index: ClientSessionEntry[] = [];
    for await (const { value } of this.deps.sessions.list<ClientSessionEntry>(clientSessionsPrefix(client.id))) index.push(value);
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

  /**
   * Sessions created by a version without the listing's index get their entries: once per
   * store (the `LISTING_INDEXED` key says it was done), by whichever gateway's housekeeping
   * comes first; several at once create the same entries (create-if-absent). Reads every
   * session summary once. Returns how many entries it created.
   */
  async indexEarlierSessions(): Promise<number> {
    const { sessions } = this.deps;
    if (await sessions.get(LISTING_INDEXED)) return 0;
    let created = 0;
    for await (const { value } of sessions.list<SessionRecord>('session.')) {
      if (value.deleted || !UPLOAD_UUID.test(value.upload_uuid)) continue;
      try {
        await sessions.create<ClientSessionEntry>(clientSessionKey(value.client_id, value.upload_uuid), { upload_uuid: value.upload_uuid, created_at: value.created_at });
        created++;
      } catch (err) {
        if (!isStoreConflict(err)) throw err;
      }
    }
    await sessions.create(LISTING_INDEXED, { at: new Date(this.now()).toISOString() }).catch((err: unknown) => {
      if (!isStoreConflict(err)) throw err;
    });
    return created;
  }
}
