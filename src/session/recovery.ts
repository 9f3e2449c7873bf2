/**
 * What session state does about a gateway that died in the middle of an ingest. The ingest
 * commits its package to the queue, then records it in the session summary, then answers
 * 200; a gateway killed between the first two steps leaves a committed package that no
 * client was told about. The uploader asks `packageVerdict` before it stores anything, and
 * stores only what the session recorded (see `packageFate` in state.ts). Both run on the
 * session store and the ledger alone: the uploader process has no session service.
 */
import { activeKey, cleanUpKey, sessionKey } from '../store/keys.js';
import { isStoreConflict, type PackageLedger, type SessionStore } from '../store/ports.js';
import {
  decideFold,
  decideIngestFence,
  decideIngestRelease,
  decideReleaseAllLeases,
  fromStored,
  holdsLeases,
  packageFate,
  type ActivePointer,
  type Decision,
  type SessionRecord,
} from './state.js';

const MAX_CAS_ATTEMPTS = 32;

/**
 * `store`, `drop` or `wait` for one queued package. The ledger first: an entry is written
 * only for a recorded package (after its record), so one there is `store` in a single read,
 * which is how the uploader usually finds a package (folded out of the summary by then); a
 * delete since is `sessionLive`'s to see, after the put. Otherwise the summary: an expired
 * lease still in it is revoked with a compare-and-set before the package is dropped, so that
 * a gateway whose clock runs behind cannot record the package afterwards; a package neither
 * recording nor leased is looked up in the ledger again, read after the summary (an entry
 * leaves `recording` only once the ledger holds it, so a recorded package is never missed)
 * and confirmed (`getConfirmed`), and dropped once a compare-and-set on the summary read has
 * landed (`decideIngestFence`: on NATS a deposed leader may have answered either read). A
 * session that reads as absent is judged by `absentSession`. `delivery`: the package's
 * delivery attempt, from 1.
 */
export async function packageVerdict(
  sessions: SessionStore,
  ledger: PackageLedger,
  uploadUuid: string,
  packageId: string,
  { delivery = 1, now = Date.now }: { delivery?: number; now?: () => number } = {},
): Promise<'store' | 'drop' | 'wait'> {
  if (await ledger.get(uploadUuid, packageId)) return 'store';
  for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
    const stored = await sessions.get<SessionRecord>(sessionKey(uploadUuid));
    if (!stored) return (await absentSession(sessions, uploadUuid, delivery)) === 'gone' ? 'drop' : 'wait';
    const record = { value: fromStored(stored.value), revision: stored.revision };
    const fate = packageFate(record.value, packageId, now());
    if (fate === 'ledger') {
      // Absence concluded from a read that cannot be stale (a deposed leader's) before the drop.
      if (await ledger.getConfirmed(uploadUuid, packageId)) return 'store';
      // Dropped only once a write proves the summary read is the stored one (`decideIngestFence`).
      if (await casOnce(sessions, uploadUuid, record, decideIngestFence(record.value, [packageId], now()))) continue;
      return 'drop';
    }
    if (fate !== 'revoke') return fate;
    // Revoked or lost to another writer: judge the summary again either way.
    await casOnce(sessions, uploadUuid, record, decideIngestRelease(record.value, [packageId], now()));
  }
  return 'wait';
}

/**
 * Whether the session is still there and not deleted, read from the leader: asked after a
 * package's put, since a delete's clean-up may have listed the session's objects before that
 * one was there. A session that reads as absent is judged by `absentSession`.
 */
export async function sessionLive(sessions: SessionStore, uploadUuid: string, delivery = 1): Promise<'live' | 'gone' | 'unsure'> {
  const stored = await sessions.get<SessionRecord>(sessionKey(uploadUuid));
  if (!stored) return absentSession(sessions, uploadUuid, delivery);
  return stored.value.deleted ? 'gone' : 'live';
}

/**
 * Deliveries of a package whose session reads as absent, with no clean-up recorded, after
 * which the session is taken as gone: redelivery waits 1 s (by default), doubling up to 30 s,
 * so about a minute and a half.
 */
export const UNSURE_DELIVERIES = 7;

/**
 * A queued package's session read as absent: `gone` when its delete's clean-up is recorded
 * (from before the delete's 200 until its late pass, `LATE_PASS_MS`, long after the summary
 * went) or after `UNSURE_DELIVERIES`, else `unsure`: judge again at the next delivery. Its
 * summary was there when the package was committed (its lease), so absent with no clean-up
 * is a read not to trust: on NATS a deposed leader answers reads for a moment after a
 * partition heals, and a session created during the cut is absent there (a package dropped
 * or an object deleted on that read would be a 200 never stored).
 */
async function absentSession(sessions: SessionStore, uploadUuid: string, delivery: number): Promise<'gone' | 'unsure'> {
  if (delivery > UNSURE_DELIVERIES || (await sessions.get(cleanUpKey(uploadUuid)))) return 'gone';
  return 'unsure';
}

/**
 * The embedded default at start: the directory belongs to this process alone, so every lease
 * in it is the previous process's, which is gone. Releasing them lets its orphaned packages
 * be dropped and `upload_tasks_finished` turn true without waiting `ingest.inFlightLeaseMs`;
 * its recorded packages whose ledger write it did not live to see are written to the ledger
 * and folded. Leases and such entries live only on a client's active session; returns how
 * many sessions held any.
 */
export async function recoverLeftovers(
  sessions: SessionStore,
  ledger: PackageLedger,
  clientIds: Iterable<string>,
  now: () => number = Date.now,
): Promise<number> {
  let recovered = 0;
  for (const clientId of clientIds) {
    const pointer = await sessions.get<ActivePointer>(activeKey(clientId));
    if (!pointer) continue;
    const uploadUuid = pointer.value.upload_uuid;
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const stored = await sessions.get<SessionRecord>(sessionKey(uploadUuid));
      if (!stored) break;
      const record = { value: fromStored(stored.value), revision: stored.revision };
      const recording = Object.entries(record.value.recording);
      if (!holdsLeases(record.value) && recording.length === 0 && !('packages' in stored.value)) break;
      await ledger.append(
        uploadUuid,
        recording.map(([id, e]) => ({ package_id: id, entity: e.entity, rows: e.rows, bytes: e.bytes, object_bytes: e.object_bytes })),
      );
      const released = decideReleaseAllLeases(record.value, now());
      const folded = released.ok ? decideFold(released.next, recording.map(([id]) => id), now()) : released;
      if (await casOnce(sessions, uploadUuid, record, folded, true)) continue;
      recovered++;
      break;
    }
  }
  return recovered;
}

/** Writes the decision; true when another writer came first (re-read and decide again). */
async function casOnce(
  sessions: SessionStore,
  uploadUuid: string,
  current: { value: SessionRecord; revision: number },
  decision: Decision,
  force = false,
): Promise<boolean> {
  if (!decision.ok || (decision.next === current.value && !force)) return false;
  try {
    await sessions.update(sessionKey(uploadUuid), decision.next, current.revision);
    return false;
  } catch (err) {
    if (isStoreConflict(err)) return true;
    throw err;
  }
}
