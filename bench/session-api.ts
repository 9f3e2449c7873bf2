/**
 * The few service calls the driver makes around a scenario: readiness, one session per
 * client, and (against a `--target`) waiting for the uploader and deleting the sessions
 * the run created. Every wait is bounded. The calls are the client library's (`src/client`).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { IngestClient } from '../src/client/client.js';
import { describeDetail, isApiError } from '../src/client/errors.js';

export interface Credentials {
  id: string;
  token: string;
}

export interface BenchSession {
  credentials: Credentials;
  uuid: string;
  /** false: the client already had an active session and the run reuses it (and leaves it). */
  created: boolean;
}

/** The session the HTTP peers answer for (they keep no sessions). */
export const PEER_UPLOAD = 'bench';

/** One client for the driver's calls: 30 s per call, no pacing (the polls below pace themselves). */
async function withClient<T>(origin: string, credentials: Credentials, fn: (client: IngestClient) => Promise<T>): Promise<T> {
  const client = new IngestClient({ baseUrl: origin, clientId: credentials.id, token: credentials.token, timeoutMs: 30_000, connections: 1, requestsPerSecond: 0 });
  try {
    return await fn(client);
  } finally {
    await client.close();
  }
}

function failure(err: unknown): string {
  return isApiError(err) ? `${err.status} ${describeDetail(err.body).slice(0, 200)}` : (err as Error).message;
}

/**
 * Polls until the server answers 200: `entities` (the service's catalog) or `status` (of
 * the peers' session); throws after `timeoutMs`.
 */
export async function waitUntilServing(origin: string, credentials: Credentials, probe: 'entities' | 'status', timeoutMs: number): Promise<void> {
  await withClient(origin, credentials, async (client) => {
    const deadline = Date.now() + timeoutMs;
    let last = 'no answer';
    for (let attempt = 0; attempt < 10_000 && Date.now() < deadline; attempt++) {
      try {
        await (probe === 'entities' ? client.entities() : client.status(PEER_UPLOAD));
        return;
      } catch (err) {
        last = failure(err);
      }
      await sleep(100);
    }
    throw new Error(`${origin} (${probe}) not ready within ${timeoutMs} ms (last: ${last})`);
  });
}

export async function initSession(origin: string, credentials: Credentials): Promise<BenchSession> {
  const init = await withClient(origin, credentials, (client) => client.initialize()).catch((err: unknown) => {
    throw new Error(`initialize-session for ${credentials.id}: ${failure(err)}`);
  });
  if (init.status === 'created') return { credentials, uuid: init.upload_uuid, created: true };
  // The client already has a session being assembled: use it, and leave it as found.
  if (init.status === 'already_exists') return { credentials, uuid: init.upload_uuid, created: false };
  throw new Error(`initialize-session for ${credentials.id}: 409 ${init.message}`);
}

/** Waits (bounded) until the uploader has stored every package, then deletes the session if the run created it. */
export async function retireSession(origin: string, session: BenchSession, timeoutMs: number): Promise<string | null> {
  return withClient(origin, session.credentials, async (client) => {
    const deadline = Date.now() + timeoutMs;
    let finished = false;
    for (let attempt = 0; attempt < 100_000 && Date.now() < deadline; attempt++) {
      const status = await client.status(session.uuid).catch(() => null);
      if (status?.upload_tasks_finished === true) {
        finished = true;
        break;
      }
      await sleep(250);
    }
    if (!session.created) return finished ? null : `session ${session.uuid}: uploads not finished within ${timeoutMs} ms`;
    try {
      await client.delete(session.uuid);
    } catch (err) {
      return `delete ${session.uuid}: ${failure(err)}`;
    }
    return finished ? null : `session ${session.uuid}: deleted before its uploads finished (${timeoutMs} ms)`;
  });
}
