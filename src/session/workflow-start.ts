/**
 * The Connector's start body of a session: its packages as the ledger lists them, inline, or
 * past `inlineObjects` in an NDJSON manifest object beside the session's objects.
 */
import type { WorkflowStart } from '../connector/types.js';
import { errors } from '../errors.js';
import { manifestKey, objectKey, sessionObjectPrefix } from '../store/keys.js';
import type { ObjectStore, PackageLedger } from '../store/ports.js';
import { toLedger } from './ledger-writer.js';
import { entityTotals, packageCount, type ClientRef, type SessionRecord } from './state.js';

/** What the start body reads of the session service's dependencies (`SessionServiceDeps`), when it is built. */
export interface WorkflowStartDeps {
  readonly ledger: PackageLedger;
  readonly objects: ObjectStore;
  readonly objectPrefix: string;
  readonly callbackUrl: string;
  /** Past this many objects the body names a manifest object instead of listing them (default 1000). */
  readonly inlineObjects?: number;
  readonly onBackgroundError?: (err: unknown, what: string) => void;
}

/**
 * The Connector's start body. Recording entries go to the ledger first (idempotent), so the
 * ledger then lists every package; past `inlineObjects` objects the list is written as an
 * NDJSON manifest object beside the session's objects and the body names it instead.
 */
export async function workflowStart(
  deps: WorkflowStartDeps,
  /** Folds packages the ledger now holds into the session's summary. */
  fold: (uploadUuid: string, entries: readonly { id: string }[]) => Promise<void>,
  client: ClientRef,
  r: SessionRecord,
): Promise<WorkflowStart> {
  const recording = Object.entries(r.recording).map(([id, e]) => ({ id, ...e }));
  if (recording.length > 0) {
    await deps.ledger.append(r.upload_uuid, recording.map(toLedger));
    await fold(r.upload_uuid, recording).catch((err: unknown) => deps.onBackgroundError?.(err, 'fold recorded packages'));
  }
  const prefix = sessionObjectPrefix(deps.objectPrefix, r.client_id, r.upload_uuid);
  let sizes: Map<string, number> | null = null;
  const expected = packageCount(r);
  const objects = (async function* (): AsyncIterable<WorkflowStart['objects'][number]> {
    let listed = 0;
    for await (const e of deps.ledger.list(r.upload_uuid)) {
      listed++;
      const key = objectKey(deps.objectPrefix, { client_id: r.client_id, upload_uuid: r.upload_uuid, entity: e.entity, package_id: e.package_id });
      let bytes = e.object_bytes;
      if (bytes === 0) {
        // Recorded by a version that did not keep the object's size: read it from storage.
        sizes ??= new Map((await deps.objects.list(prefix)).map((o) => [o.key, o.size]));
        bytes = sizes.get(key) ?? e.bytes;
      }
      yield { entity: e.entity, key, rows: e.rows, bytes };
    }
    if (listed !== expected) throw errors.internal(new Error(`Ledger of ${r.upload_uuid} lists ${listed} packages, the summary ${expected}`));
  })();
  const base = {
    upload_uuid: r.upload_uuid,
    client_id: client.id,
    date_from: r.workflow!.date_from,
    date_to: r.workflow!.date_to,
    entities: entityTotals(r).map(({ name, packages, rows }) => ({ name, packages, rows })),
    callback_url: deps.callbackUrl,
  };
  if (expected <= (deps.inlineObjects ?? 1000)) {
    const inline: WorkflowStart['objects'] = [];
    for await (const o of objects) inline.push(o);
    return { ...base, objects: inline };
  }
  const key = manifestKey(deps.objectPrefix, r.client_id, r.upload_uuid);
  let count = 0;
  let bytes = 0;
  const lines = async function* (): AsyncIterable<Uint8Array> {
    let chunk = '';
    for await (const o of objects) {
      count++;
      chunk += `${JSON.stringify(o)}\n`;
      if (chunk.length >= 256 * 1024) {
        const buf = Buffer.from(chunk);
        bytes += buf.byteLength;
        chunk = '';
        yield buf;
      }
    }
    const buf = Buffer.from(chunk);
    bytes += buf.byteLength;
    yield buf;
  };
  await deps.objects.put(key, lines());
  return { ...base, objects: [], manifest: { key, objects: count, bytes } };
}
