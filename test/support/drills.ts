/**
 * Shared pieces of the failure drills (test/drills/): their size (CI or `DRILL_LONG=1`), a
 * clients file with many clients, packages whose rows carry ids unique per package, and
 * reading back what was stored and what the session records, straight from the stores.
 */
import { existsSync } from 'node:fs';
import { readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { hashToken } from '../../src/http/auth.js';
import { fromStored, type SessionRecord } from '../../src/session/state.js';
import { SqliteLedger } from '../../src/store/embedded/ledger.js';
import { SqliteSessionStore } from '../../src/store/embedded/session-store.js';
import { openStateReader } from '../../src/store/embedded/state-schema.js';
import { STATE_DB } from '../../src/store/engines.js';
import { sessionKey } from '../../src/store/keys.js';
import { connectNats } from '../../src/store/nats/connection.js';
import { NatsLedger } from '../../src/store/nats/ledger.js';
import { NatsSessionStore } from '../../src/store/nats/session-store.js';
import { countRows, type ObjectHeader } from '../../src/store/object-format.js';
import type { ObjectStore } from '../../src/store/ports.js';
import { S3ObjectStore } from '../../src/store/s3/object-store.js';
import type { S3Endpoint } from '../../testbed/s3.js';
import { clientOf } from './harness.js';

interface Teardown {
  teardown(fn: () => unknown): void;
}

/** `DRILL_LONG=1` runs the long variants; CI runs the short ones, which still exercise each drill. */
export const LONG = process.env.DRILL_LONG === '1';
export const size = <T>(ci: T, long: T): T => (LONG ? long : ci);

export interface DrillClient {
  id: string;
  token: string;
}

/** A clients file of `n` clients `drill-<i>` (token `drill-token-<i>`), from loopback unless `allowedIps` says where else. */
export async function writeClients(dir: string, n: number, allowedIps = ['127.0.0.0/8', '::1/128']): Promise<{ file: string; clients: DrillClient[] }> {
  const clients = Array.from({ length: n }, (_, i) => ({ id: `drill-${i}`, token: `drill-token-${i}` }));
  const file = join(dir, 'clients.json');
  await writeFile(
    file,
    JSON.stringify({
      clients: clients.map((c) => ({ client_id: c.id, token_sha256: hashToken(c.token), allowed_ips: allowedIps, min_date: '2020-01-01' })),
    }),
  );
  return { file, clients };
}

/** Package `n` of `tag`: `rows` products whose ids `<tag>/<n>/<i>` name the package. */
export function drillPackage(tag: string, n: number, rows: number, pad = 0) {
  return {
    columns: ['product_id', 'name', 'price'],
    data: Array.from({ length: rows }, (_, i) => [`${tag}/${n}/${i}`, `Product ${i}${'x'.repeat(pad)}`, i % 100]),
  };
}

/** The package a row id belongs to: `<tag>/<n>`. */
export const packageOfRow = (id: string): string => id.slice(0, id.lastIndexOf('/'));

export interface StoredObject {
  key: string;
  header: ObjectHeader;
  /** First column of every row line, in order. */
  ids: string[];
  /** Lines after the header that are not a row (a JSON array with a string id first), as they are: none in a whole package. */
  malformed: string[];
}

export async function readObjects(store: ObjectStore, prefix = ''): Promise<StoredObject[]> {
  const out: StoredObject[] = [];
  for (const { key } of await store.list(prefix)) {
    const chunks: Buffer[] = [];
    for await (const chunk of (await store.get(key))!) chunks.push(Buffer.from(chunk));
    const lines = Buffer.concat(chunks).toString('utf8').split('\n').filter((l) => l.trim() !== '');
    const header = JSON.parse(lines[0]!) as ObjectHeader;
    const ids: string[] = [];
    const malformed: string[] = [];
    for (const line of lines.slice(1)) {
      const row = (() => {
        try {
          return JSON.parse(line) as unknown;
        } catch {
          return null;
        }
      })();
      if (Array.isArray(row) && typeof row[0] === 'string') ids.push(row[0]);
      else malformed.push(line);
    }
    out.push({ key, header, ids, malformed });
  }
  return out;
}

/** `countRows` agrees with the lines: the header's count is what the emulator counts. */
export async function rowsOf(store: ObjectStore, key: string): Promise<number> {
  return (await countRows((await store.get(key))!)).rows;
}

export function openS3(s3: S3Endpoint): Promise<S3ObjectStore> {
  return S3ObjectStore.open({ endpoint: s3.endpoint, bucket: s3.bucket, region: s3.region, accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey });
}

/** A session summary with the ids of every package it records: `recording` and the ledger's entries. */
export type RecordedSession = SessionRecord & { packages: { id: string }[] };

function withPackages(record: SessionRecord, ledgerIds: Iterable<string>): RecordedSession {
  const ids = new Set([...Object.keys(record.recording), ...ledgerIds]);
  return { ...record, packages: [...ids].map((id) => ({ id })) };
}

/** The session as the embedded store keeps it (read from its database; no store opened, the gateway may be running). */
export async function embeddedRecord(dataDir: string, uploadUuid: string): Promise<RecordedSession | null> {
  const path = join(dataDir, STATE_DB);
  if (!existsSync(path)) return null;
  const stored = SqliteSessionStore.peek<SessionRecord>(path, sessionKey(uploadUuid));
  if (!stored) return null;
  const record = fromStored(stored.value);
  const ids = SqliteLedger.peek(path, uploadUuid).map((e) => e.package_id);
  return withPackages(record, ids);
}

/**
 * Committed, unacked packages of the embedded queue per session: the rows of the state
 * database's `queue` table (no queue opened: nothing is cleaned). Embedded only, while no gateway runs.
 */
export async function embeddedQueued(dataDir: string): Promise<Map<string, Set<string>>> {
  const out = new Map<string, Set<string>>();
  const path = join(dataDir, STATE_DB);
  if (!existsSync(path)) return out;
  const db = openStateReader(path);
  try {
    for (const { upload, record } of db.prepare<[], { upload: string; record: string }>('SELECT upload, record FROM queue ORDER BY seq').all()) {
      const { meta } = JSON.parse(record) as { meta: { package_id: string } };
      out.set(upload, (out.get(upload) ?? new Set()).add(meta.package_id));
    }
  } finally {
    db.close();
  }
  return out;
}

/** A reader of sessions on NATS KV (the buckets of the default configuration, with `replicas` as the gateways made them). */
export async function natsRecords(t: Teardown, url: string, replicas = 1): Promise<(uploadUuid: string) => Promise<RecordedSession | null>> {
  const nats = await connectNats({ servers: url, name: 'drill-reader', requestTimeoutMs: 5000 });
  t.teardown(() => nats.close());
  const store = await NatsSessionStore.open(nats, { bucket: 'ingest_sessions', replicas });
  const ledger = await NatsLedger.open(nats, { bucket: 'ingest_ledger', replicas });
  return async (uuid) => {
    const stored = (await store.get<SessionRecord>(sessionKey(uuid)))?.value;
    if (!stored) return null;
    const ids: string[] = [];
    for await (const e of ledger.list(uuid)) ids.push(e.package_id);
    return withPackages(fromStored(stored), ids);
  };
}

/** Polls `cond` until it holds (the service is asynchronous by contract); bounded, with what it saw last on failure. */
export async function until<T>(what: string, probe: () => Promise<T>, cond: (v: T) => boolean, timeoutMs: number, everyMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (cond(v)) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not reached in ${timeoutMs} ms; last seen ${JSON.stringify(v)?.slice(0, 2000)}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** Milliseconds since `t0`, rounded, for the measurements the drills print. */
export const since = (t0: number): number => Math.round(performance.now() - t0);

/** A request's fate as a drill saw it: its HTTP status, or no answer (cut off by a kill). */
export type Outcome = number | 'no-answer';

/**
 * Holds what was stored against what was answered and recorded (the checker of the kill and
 * power-cut drills): each package answered 200 stored exactly once, nothing answered
 * otherwise stored, a cut-off one stored only if its session recorded it (counted, not
 * failed), every object one whole package of `rows` rows, no row twice, nothing stored that
 * its session does not record, every recorded package stored, every stored one sent.
 */
export function checkStored(
  t: { equal(a: unknown, b: unknown, msg: string): void; ok(v: unknown, msg: string): void },
  objects: readonly { header: { upload_uuid: string; package_id: string; rows: number }; ids: string[] }[],
  records: ReadonlyMap<string, RecordedSession | null>,
  outcomes: ReadonlyMap<string, Outcome>,
  rows: number,
): { statuses: Map<Outcome, number>; acceptedMissing: number; cutStored: number; cutNotStored: number } {
  const storedPackages = new Map<string, number>();
  const rowSeen = new Map<string, number>();
  let notWhole = 0;
  let unrecorded = 0;
  for (const o of objects) {
    const pkgs = new Set(o.ids.map(packageOfRow));
    if (pkgs.size !== 1 || o.ids.length !== rows || o.header.rows !== rows) notWhole++;
    for (const p of pkgs) storedPackages.set(p, (storedPackages.get(p) ?? 0) + 1);
    for (const id of o.ids) rowSeen.set(id, (rowSeen.get(id) ?? 0) + 1);
    if (!records.get(o.header.upload_uuid)?.packages.some((p) => p.id === o.header.package_id)) unrecorded++;
  }
  const recordedTotal = [...records.values()].reduce((n, r) => n + (r?.packages.length ?? 0), 0);
  let acceptedMissing = 0;
  let acceptedTwice = 0;
  let rejectedStored = 0;
  let cutStored = 0;
  let cutNotStored = 0;
  const statuses = new Map<Outcome, number>();
  for (const [pkg, outcome] of outcomes) {
    statuses.set(outcome, (statuses.get(outcome) ?? 0) + 1);
    const stored = storedPackages.get(pkg) ?? 0;
    if (outcome === 200) {
      if (stored === 0) acceptedMissing++;
      if (stored > 1) acceptedTwice++;
    } else if (outcome === 'no-answer') {
      if (stored > 0) cutStored++;
      else cutNotStored++;
    } else if (stored > 0) {
      rejectedStored++;
    }
  }
  t.equal(acceptedMissing, 0, 'every package that got 200 is stored');
  t.equal(acceptedTwice, 0, '... exactly once');
  t.equal(rejectedStored, 0, 'no package that got an error status is stored');
  t.equal(notWhole, 0, `every object holds one whole package (${notWhole} do not, of ${objects.length})`);
  t.ok([...rowSeen.values()].every((n) => n === 1), 'no row is stored twice');
  t.equal(unrecorded, 0, `nothing is stored that its session does not record (${unrecorded} are)`);
  t.equal(objects.length, recordedTotal, `every recorded package is stored (${objects.length} objects, ${recordedTotal} recorded)`);
  t.ok([...storedPackages.keys()].every((p) => outcomes.has(p)), 'every stored package was sent');
  return { statuses, acceptedMissing, cutStored, cutNotStored };
}

/** One client's session in a drill. */
export interface DrillSession {
  client: DrillClient;
  uuid: string;
}

/** What a cycle of `loadUntilCut` sent and was answered. */
export interface CutCycle {
  sent: number;
  accepted: number;
  inFlightAtCut: number;
  outcomes: Map<string, Outcome>;
  /** The `cutAfter`-th 200 never came: the power was cut at the deadline instead. */
  late: boolean;
}

/** A cycle that has not reached its cut by then is cut anyway, and fails (a gateway that stopped answering 200). */
export const CYCLE_DEADLINE_MS = 60_000;

/**
 * `lanes` senders, one package of `rows` rows after another, until the sender that sees the
 * `cutAfter`-th 200 calls `cut` (a power cut: the power-cut drills' kill of their processes and disk).
 */
export async function loadUntilCut(opts: {
  gateway: { url: string };
  sessions: readonly DrillSession[];
  cycle: number;
  cutAfter: number;
  lanes: number;
  rows: number;
  cut: () => Promise<unknown>;
}): Promise<CutCycle> {
  const { gateway, sessions, cycle, cutAfter, lanes, rows } = opts;
  const outcomes = new Map<string, Outcome>();
  let accepted = 0;
  let sent = 0;
  let open = 0;
  let inFlightAtCut = 0;
  let cut: Promise<unknown> | undefined;
  let late = false;
  const deadline = setTimeout(() => {
    late = true;
    inFlightAtCut = open;
    cut ??= opts.cut();
  }, CYCLE_DEADLINE_MS);
  const sender = async (s: DrillSession, lane: number) => {
    const api = clientOf(gateway, s.client);
    for (let k = 0; !cut; k++) {
      const pkg = `${s.client.id}~${cycle}~${lane}/${k}`;
      sent++;
      open++;
      let outcome: Outcome;
      try {
        outcome = (await api.ingest(s.uuid, 'products', drillPackage(pkg.slice(0, pkg.lastIndexOf('/')), k, rows))).status;
      } catch {
        outcome = 'no-answer';
      }
      open--;
      outcomes.set(pkg, outcome);
      if (outcome === 200 && ++accepted === cutAfter && !cut) {
        inFlightAtCut = open;
        cut = opts.cut();
      }
    }
  };
  await Promise.all(Array.from({ length: lanes }, (_, lane) => sender(sessions[lane % sessions.length]!, lane)));
  clearTimeout(deadline);
  await cut;
  return { sent, accepted, inFlightAtCut, outcomes, late };
}
