/**
 * Key layout shared by every adapter. Session-store keys are `[A-Za-z0-9_.=-]+`; client ids
 * are hex-encoded there so that any id is safe. Object keys are
 * `<prefix>/<client_id>/<upload_uuid>/<entity>/<package_id>.ndjson`, the client id
 * URI-encoded into one path segment.
 */
import { createHash } from 'node:crypto';
import type { PackageMeta } from './ports.js';

/** Written and removed by every readiness probe (store/engines.ts): a store that only reads does not pass. */
export const READINESS_KEY = 'readiness.probe';

/**
 * Written once and never deleted (NATS, store/nats/lost-keys.ts): a bucket whose every other
 * key was deleted, and their markers removed, still holds a message, so an empty stream whose
 * sequence moved always means that the server lost what it held.
 */
export const KEPT_KEY = 'store.kept';

export const sessionKey = (uploadUuid: string): string => `session.${uploadUuid}`;

export const activeKey = (clientId: string): string => `active.${Buffer.from(clientId, 'utf8').toString('hex')}`;

/** One record per (client, `Idempotency-Key`); the key is hashed, so any key and length fit. */
export const idempotencyKey = (clientId: string, key: string): string =>
  `${idempotencyPrefix(clientId)}${createHash('sha256').update(key, 'utf8').digest('hex')}`;

/** The `SessionStore.list` prefix of one client's idempotency records. */
export const idempotencyPrefix = (clientId: string): string => `idem.${Buffer.from(clientId, 'utf8').toString('hex')}.`;

/** How many of a session's packages the uploader stored (session/stored-counts.ts). */
export const storedCountKey = (uploadUuid: string): string => `stored.${uploadUuid}`;

/**
 * A client's sessions, one key each, for the listing (`GET /api/v1/uploading/sessions`): its
 * creation time (milliseconds, 15 digits) and id in the key, so a listing sorts and pages the
 * client's sessions by key names alone and reads only the sessions of its page.
 */
export const clientSessionKey = (clientId: string, uploadUuid: string, createdAt: string): string =>
  `${clientSessionsPrefix(clientId)}${String(Date.parse(createdAt)).padStart(15, '0')}.${uploadUuid}`;

/** The listing's key of a session as versions before 2026-11-30 wrote it (creation time in its value only). */
export const legacyClientSessionKey = (clientId: string, uploadUuid: string): string => `${clientSessionsPrefix(clientId)}${uploadUuid}`;

/** The `SessionStore.list` prefix of one client's session index: the listing reads only the client's own keys. */
export const clientSessionsPrefix = (clientId: string): string => `sessions.${Buffer.from(clientId, 'utf8').toString('hex')}.`;

/** The clean-up a delete left to do (session/clean-up.ts), until it is done. */
export const cleanUpKey = (uploadUuid: string): string => `cleanup.${uploadUuid}`;

/** Everything the service stores: `<prefix>/` (or every key when `prefix` is empty), never a key of `<prefix>-other/`. */
export function serviceObjectPrefix(prefix: string): string {
  const head = prefix.replace(/\/+$/, '');
  return head ? `${head}/` : '';
}

/** Everything stored for one session ends with a `/`, so one session's prefix never matches another's. */
export function sessionObjectPrefix(prefix: string, clientId: string, uploadUuid: string): string {
  // `.` and `..` would be path steps, not names, to a file system or a URL.
  const client = encodeURIComponent(clientId).replace(/^\.{1,2}$/, (dots) => '%2E'.repeat(dots.length));
  return `${serviceObjectPrefix(prefix)}${client}/${uploadUuid}/`;
}

export function objectKey(prefix: string, meta: Pick<PackageMeta, 'client_id' | 'upload_uuid' | 'entity' | 'package_id'>): string {
  return `${sessionObjectPrefix(prefix, meta.client_id, meta.upload_uuid)}${meta.entity}/${meta.package_id}.ndjson`;
}

/** The Connector start's manifest of a session with many objects: beside its objects, never an entity's name. */
export function manifestKey(prefix: string, clientId: string, uploadUuid: string): string {
  return `${sessionObjectPrefix(prefix, clientId, uploadUuid)}manifest.ndjson`;
}
