/**
 * What session state does about a gateway that died in the middle of an ingest. The ingest
 * commits its package to the queue, then records it in the session, then answers 200; a
 * gateway killed between the first two steps leaves a committed package that no client was
 * told about. The uploader asks `packageVerdict` before it stores anything, and stores only
 * what the session recorded (see `packageFate` in state.ts). Both run on the session store
 * alone: the uploader process has no session service.
 */
import { activeKey, sessionKey } from '../store/keys.js';
import { isStoreConflict, type SessionStore } from '../store/ports.js';
import { decideIngestRelease, decideReleaseAllLeases, packageFate, type ActivePointer, type Decision, type SessionRecord } from './state.js';

const MAX_CAS_ATTEMPTS = 32;

/**
 * `store`, `drop` or `wait` for one queued package. An expired lease still in the record is
 * revoked with a compare-and-set before the package is dropped, so that a gateway whose clock
 * runs behind cannot record the package afterwards.
 */
export async function packageVerdict(
  sessions: SessionStore,
  uploadUuid: string,
  packageId: string,
  now: () => number = Date.now,
): Promise<'store' | 'drop' | 'wait'> {
  for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
    const record = await sessions.get<SessionRecord>(sessionKey(uploadUuid));
    const fate = packageFate(record?.value ?? null, packageId, now());
    if (fate !== 'revoke') return fate;
    // Revoked or lost to another writer: judge the record again either way.
    await casOnce(sessions, uploadUuid, record!, decideIngestRelease(record!.value, packageId, now()));
  }
  return 'wait';
}

/**
 * The embedded default at start: the directory belongs to this process alone, so every lease
 * in it is the previous process's, which is gone. Releasing them at once lets its
 * orphaned packages be dropped and `upload_tasks_finished` turn true without waiting
 * `ingest.inFlightLeaseMs`. Leases live only on a client's active session; returns how many
 * sessions held any.
 */
export async function releaseLeftoverLeases(sessions: SessionStore, clientIds: Iterable<string>, now: () => number = Date.now): Promise<number> {
  let released = 0;
  for (const clientId of clientIds) {
    const pointer = await sessions.get<ActivePointer>(activeKey(clientId));
    if (!pointer) continue;
    for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
      const record = await sessions.get<SessionRecord>(sessionKey(pointer.value.upload_uuid));
      if (!record || Object.keys(record.value.in_flight).length === 0) break;
      if (await casOnce(sessions, pointer.value.upload_uuid, record, decideReleaseAllLeases(record.value, now()))) continue;
      released++;
      break;
    }
  }
  return released;
}

/** Writes the decision; true when another writer came first (re-read and decide again). */
async function casOnce(
  sessions: SessionStore,
  uploadUuid: string,
  current: { value: SessionRecord; revision: number },
  decision: Decision,
): Promise<boolean> {
  if (!decision.ok || decision.next === current.value) return false;
  try {
    await sessions.update(sessionKey(uploadUuid), decision.next, current.revision);
    return false;
  } catch (err) {
    if (isStoreConflict(err)) return true;
    throw err;
  }
}
