import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import type { Config } from '../../src/config/config.js';
import { silentLogger, type Logger } from '../../src/log.js';
import { SessionService } from '../../src/session/service.js';
import { FileBatchQueue } from '../../src/store/embedded/batch-queue.js';
import { FileObjectStore } from '../../src/store/embedded/object-store.js';
import type { Engines } from '../../src/store/engines.js';
import type { ObjectStore, PackageMeta, StoredObject } from '../../src/store/ports.js';
import { objectKey, sessionObjectPrefix } from '../../src/store/keys.js';
import { countRows } from '../../src/store/object-format.js';
import { runUploader, startUploader } from '../../src/uploader/uploader.js';
import { embeddedStores } from '../support/embedded-stores.js';

const meta = (package_id: string, entity = 'stores'): PackageMeta => ({
  package_id,
  upload_uuid: '5d0c7c4e-8a57-4e0b-9b8e-2f3c1d4a5b6c',
  client_id: 'acme/eu west',
  entity,
  columns: ['store_id', 'name'],
});

async function* bytes(s: string): AsyncIterable<Uint8Array> {
  yield Buffer.from(s);
}

async function text(body: AsyncIterable<Uint8Array> | null): Promise<string> {
  const parts: Uint8Array[] = [];
  for await (const c of body ?? []) parts.push(c);
  return Buffer.concat(parts).toString('utf8');
}

/** An ObjectStore that reports each put's outcome and can fail the first put of a key midway. */
function observed(inner: ObjectStore, failFirst: Set<string>) {
  const done: { key: string; ok: boolean }[] = [];
  const waiters: (() => void)[] = [];
  const store: ObjectStore = {
    async put(key, body): Promise<StoredObject> {
      try {
        if (failFirst.delete(key)) {
          for await (const _ of body) throw new Error('connection reset');
        }
        const stored = await inner.put(key, body);
        done.push({ key, ok: true });
        return stored;
      } catch (err) {
        done.push({ key, ok: false });
        throw err;
      } finally {
        waiters.splice(0).forEach((w) => w());
      }
    },
    capabilities: inner.capabilities,
    get: (key) => inner.get(key),
    list: (prefix) => inner.list(prefix),
    deletePrefix: (prefix) => inner.deletePrefix(prefix),
    close: () => inner.close(),
  };
  const until = async (cond: () => boolean): Promise<void> => {
    while (!cond()) await new Promise<void>((resolve) => waiters.push(resolve));
  };
  return { store, done, until };
}

/** A session of the embedded stores with one package committed and recorded (its ledger entry written): the uploader's next delivery. */
async function recordedPackage(t: Test, prefix: string) {
  const stores = await embeddedStores(t, prefix);
  const { sessions, ledger, queue, objects } = stores;
  const client = { id: 'acme', minDate: '2020-01-01' };
  const service = new SessionService({
    sessions,
    ledger,
    queue,
    objects,
    connector: { start: async () => ({}), terminate: async () => {}, close: async () => {} },
    objectPrefix: 'up',
    inFlightLeaseMs: 60_000,
    callbackUrl: 'http://x/cb',
    ledgerLingerMs: 0,
  });
  t.teardown(() => service.close());
  const { upload_uuid: uuid } = await service.initialize(client);
  const id = await service.beginIngest(client, uuid);
  const w = await queue.open({ package_id: id, client_id: client.id, upload_uuid: uuid, entity: 'stock', columns: ['store_id'] });
  await w.append(Buffer.from('["s1"]\n'));
  await w.commit({ rows: 1, bytes: 7 });
  await service.recordIngest(client, uuid, { id, entity: 'stock', rows: 1, bytes: 7, object_bytes: 100 });
  await service.flushLedger();
  return { ...stores, service, client, uuid };
}

/** Runs the uploader as the gateway does (prefix `up`, one at a time); `settled`: the first delivery's fate. */
async function uploading(t: Test, stores: Pick<Engines, 'sessions' | 'ledger' | 'queue' | 'objects'>, log: Logger): Promise<{ settled: Promise<string> }> {
  let outcome!: (what: string) => void;
  const settled = new Promise<string>((resolve) => (outcome = resolve));
  const uploader = await runUploader(
    { ...stores, sweepIncompleteUploads: async () => 0 },
    { storage: { objectPrefix: 'up', uploaderConcurrency: 1 }, s3: { abortIncompleteAfterMs: 3_600_000 } } as Pick<Config, 'storage' | 's3'>,
    log,
    { stored: () => outcome('stored'), abandoned: () => outcome('abandoned'), failed: () => outcome('failed') },
  );
  t.teardown(() => uploader.stop());
  return { settled };
}

t.test('objectKey', async (t) => {
  const m = meta('p1');
  t.equal(objectKey('exports', m), 'exports/acme%2Feu%20west/5d0c7c4e-8a57-4e0b-9b8e-2f3c1d4a5b6c/stores/p1.ndjson');
  t.equal(objectKey('', m), 'acme%2Feu%20west/5d0c7c4e-8a57-4e0b-9b8e-2f3c1d4a5b6c/stores/p1.ndjson', 'no leading slash');
  t.equal(objectKey('a/b/', m).split('/').slice(0, 3).join('/'), 'a/b/acme%2Feu%20west', 'trailing slash of prefix dropped');
  t.match(objectKey('', { ...m, client_id: '..' }), /^%2E%2E\//, '".." is still one safe segment');
});

t.test('countRows', async (t) => {
  const header = { entity: 'stores', columns: ['a'], package_id: 'p', upload_uuid: 'u', client_id: 'c', rows: 3 };
  const body = `${JSON.stringify(header)}\n["1"]\n\n["2"]\n["3"]`;
  async function* split(): AsyncIterable<Uint8Array> {
    const buf = Buffer.from(body);
    for (let i = 0; i < buf.length; i += 4) yield buf.subarray(i, i + 4);
  }
  t.same(await countRows(split()), { header, rows: 3 }, 'chunk boundaries anywhere, blank lines and no final newline');
  t.same(await countRows(bytes(JSON.stringify(header))), { header, rows: 0 }, 'header only');
  await t.rejects(countRows(bytes('')));
});

t.test('uploader: one object per package, header + rows, a failed put is redelivered', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'ingest-uploader-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const queue = await FileBatchQueue.open(join(dir, 'queue'), join(dir, 'state.sqlite'), { redeliveryDelayMs: 5 });
  t.teardown(() => queue.close());
  const files = await FileObjectStore.open(join(dir, 'objects'));
  t.teardown(() => files.close());

  const flakyKey = objectKey('exports', meta('p2', 'products'));
  const objects = observed(files, new Set([flakyKey]));
  const errors: string[] = [];
  const uploader = startUploader({
    queue,
    objects: objects.store,
    prefix: 'exports',
    onError: (err, pkg) => errors.push(`${pkg.package_id}: ${(err as Error).message}`),
  });
  t.teardown(() => uploader.stop());

  const packages: [PackageMeta, string[]][] = [
    [meta('p1'), ['["s1","One"]\n["s2","Two"]\n', '["s3","Three"]\n']],
    [meta('p2', 'products'), ['["x1","X"]\n']],
  ];
  for (const [m, batches] of packages) {
    const w = await queue.open(m);
    for (const b of batches) await w.append(Buffer.from(b));
    await w.commit({ rows: batches.join('').split('\n').length - 1, bytes: Buffer.byteLength(batches.join('')) });
  }
  await objects.until(() => objects.done.filter((d) => d.ok).length === 2);
  await uploader.stop();

  t.same(errors, ['p2: connection reset'], 'onError told once');
  t.same(objects.done.map((d) => `${d.key.split('/').at(-1)} ${d.ok}`), ['p1.ndjson true', 'p2.ndjson false', 'p2.ndjson true']);
  t.equal(await queue.pending(meta('p1').upload_uuid), 0, 'all acked');
  const listed = await files.list('exports/');
  t.same(listed.map((o) => o.key), [objectKey('exports', meta('p1')), flakyKey].sort(), 'each package stored once');

  for (const [m, batches] of packages) {
    const { package_id, upload_uuid, client_id, entity, columns } = m;
    const header = { entity, columns, package_id, upload_uuid, client_id, rows: batches.join('').split('\n').length - 1 };
    const stored = await text(await files.get(objectKey('exports', m)));
    t.equal(stored, `${JSON.stringify(header)}\n${batches.join('')}`, `${package_id}: header line, then the batches unchanged`);
    t.same(await countRows(await files.get(objectKey('exports', m)) ?? bytes('')), { header, rows: header.rows });
  }
});

t.test('a session deleted while its package is put: the object goes again, nothing of the session stays', async (t) => {
  const { sessions, ledger, queue, objects, service, client, uuid } = await recordedPackage(t, 'uploader-delete-');

  // The put has its body and completes only when released: an upload under way, its object not there yet.
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  let putting!: () => void;
  const underWay = new Promise<void>((resolve) => (putting = resolve));
  const gated: ObjectStore = {
    capabilities: objects.capabilities,
    list: (prefix) => objects.list(prefix),
    get: (key) => objects.get(key),
    deletePrefix: (prefix) => objects.deletePrefix(prefix),
    close: async () => {},
    async put(key, body) {
      const chunks: Uint8Array[] = [];
      for await (const c of body) chunks.push(c);
      putting();
      await released;
      return objects.put(key, (async function* () {
        yield* chunks;
      })());
    },
  };
  const { settled } = await uploading(t, { sessions, ledger, queue, objects: gated }, silentLogger);

  await underWay;
  await service.delete(client, uuid);
  await service.cleanUpsIdle();
  t.same(await objects.list(sessionObjectPrefix('up', client.id, uuid)), [], "the delete's clean-up is done: no object yet");
  release();
  t.equal(await settled, 'abandoned', 'the uploader finds the session deleted after its put');
  t.same(await objects.list(sessionObjectPrefix('up', client.id, uuid)), [], 'and deletes the object it stored');
});

t.test('a session deleted after its package was taken, before its batches are read: acked unstored, nothing put, nothing logged as a failure', async (t) => {
  const { sessions, ledger, queue, objects, service, client, uuid } = await recordedPackage(t, 'uploader-purged-');

  // The put starts reading its body only when released: the delete comes between the take and the read.
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  let putting!: () => void;
  const underWay = new Promise<void>((resolve) => (putting = resolve));
  const puts: string[] = [];
  const gated: ObjectStore = {
    capabilities: objects.capabilities,
    list: (prefix) => objects.list(prefix),
    get: (key) => objects.get(key),
    deletePrefix: (prefix) => objects.deletePrefix(prefix),
    close: async () => {},
    async put(key, body) {
      putting();
      await released;
      try {
        const stored = await objects.put(key, body);
        puts.push('stored');
        return stored;
      } catch (err) {
        puts.push((err as { code?: string }).code ?? String(err));
        throw err;
      }
    },
  };
  const errors: string[] = [];
  const log = { ...silentLogger, error: (msg: string) => void errors.push(msg) };
  const { settled } = await uploading(t, { sessions, ledger, queue, objects: gated }, log);

  await underWay;
  await service.delete(client, uuid);
  await service.cleanUpsIdle();
  release();
  t.equal(await settled, 'abandoned', 'the package is acked unstored');
  t.same(puts, ['QUEUE_PACKAGE_DROPPED'], 'its read ends at the purge: nothing of it is put');
  t.same(errors, [], 'no failure logged');
  t.equal(await queue.pending(uuid), 0, 'nothing of the session is left in the queue');
  t.same(await objects.list(sessionObjectPrefix('up', client.id, uuid)), [], 'and no object');
});

t.test('a session read as absent after the put, with no clean-up recorded (a deposed NATS leader around a heal): the object stays and the package is delivered again, then counted; nothing logged as a failure', async (t) => {
  const { sessions, ledger, queue, objects, client, uuid } = await recordedPackage(t, 'uploader-absent-');
  let absent = 0;
  const reads: string[] = [];
  const stale: typeof sessions = Object.assign(Object.create(sessions) as typeof sessions, {
    get: async <T>(key: string) => {
      reads.push(key);
      // The first read of the summary (the check after the put) answers absent.
      if (key === `session.${uuid}` && absent++ === 0) return null;
      return sessions.get<T>(key);
    },
  });
  const puts: string[] = [];
  const counting: ObjectStore = Object.assign(Object.create(objects) as ObjectStore, {
    put: async (key: string, body: AsyncIterable<Uint8Array>) => (puts.push(key), objects.put(key, body)),
  });
  const errors: string[] = [];
  const log = { ...silentLogger, error: (msg: string) => void errors.push(msg) };
  const { settled } = await uploading(t, { sessions: stale, ledger, queue, objects: counting }, log);
  t.equal(await settled, 'stored', 'stored, not abandoned');
  t.equal(puts.length, 2, 'put, judged unsure, delivered again and put again');
  t.ok(reads.includes(`cleanup.${uuid}`), 'the absent read looked for a clean-up record');
  t.equal((await objects.list(sessionObjectPrefix('up', client.id, uuid))).length, 1, 'the object is there');
  t.equal((await ledger.storedCounts!(uuid)).get('stock'), 1, 'counted once');
  t.same(errors, [], 'no failure logged');
});
