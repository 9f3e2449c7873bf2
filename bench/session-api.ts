/**
 * The few service calls the driver makes around a scenario: readiness, one session per
 * client, and (against a `--target`) waiting for the uploader and deleting the sessions
 * the run created. Every wait is bounded.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { request } from 'undici';

export const API = '/api/v1/uploading';

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

export function authHeaders(c: Credentials): Record<string, string> {
  return { authorization: c.token, 'client-id': c.id };
}

async function call(origin: string, method: 'GET' | 'POST', path: string, headers: Record<string, string>) {
  const res = await request(origin + path, { method, headers, headersTimeout: 30_000, bodyTimeout: 30_000 });
  const text = await res.body.text();
  let body: unknown = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  return { status: res.statusCode, body, text };
}

/** Polls `path` until it answers 200; throws after `timeoutMs`. */
export async function waitUntilServing(origin: string, path: string, headers: Record<string, string>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = 'no answer';
  for (let attempt = 0; attempt < 10_000 && Date.now() < deadline; attempt++) {
    try {
      const res = await call(origin, 'GET', path, headers);
      if (res.status === 200) return;
      last = `${res.status} ${res.text.slice(0, 200)}`;
    } catch (err) {
      last = (err as Error).message;
    }
    await sleep(100);
  }
  throw new Error(`${origin}${path} not ready within ${timeoutMs} ms (last: ${last})`);
}

export async function initSession(origin: string, credentials: Credentials): Promise<BenchSession> {
  const res = await call(origin, 'POST', `${API}/initialize-session`, authHeaders(credentials));
  const body = res.body as { upload_uuid?: unknown; status?: unknown } | null;
  if (res.status === 200 && typeof body?.upload_uuid === 'string') return { credentials, uuid: body.upload_uuid, created: true };
  // The client already has a session being assembled: use it, and leave it as found.
  if (res.status === 409 && body?.status === 'already_exists' && typeof body.upload_uuid === 'string') {
    return { credentials, uuid: body.upload_uuid, created: false };
  }
  throw new Error(`initialize-session for ${credentials.id}: ${res.status} ${res.text.slice(0, 300)}`);
}

/** Waits (bounded) until the uploader has stored every package, then deletes the session if the run created it. */
export async function retireSession(origin: string, session: BenchSession, timeoutMs: number): Promise<string | null> {
  const headers = authHeaders(session.credentials);
  const deadline = Date.now() + timeoutMs;
  let finished = false;
  for (let attempt = 0; attempt < 100_000 && Date.now() < deadline; attempt++) {
    const res = await call(origin, 'GET', `${API}/${session.uuid}/status`, headers);
    if (res.status === 200 && (res.body as { upload_tasks_finished?: unknown }).upload_tasks_finished === true) {
      finished = true;
      break;
    }
    await sleep(250);
  }
  if (!session.created) return finished ? null : `session ${session.uuid}: uploads not finished within ${timeoutMs} ms`;
  const res = await call(origin, 'POST', `${API}/${session.uuid}/delete`, headers);
  if (res.status !== 200) return `delete ${session.uuid}: ${res.status} ${res.text.slice(0, 200)}`;
  return finished ? null : `session ${session.uuid}: deleted before its uploads finished (${timeoutMs} ms)`;
}
