import { createHash, randomBytes } from 'node:crypto';
import { utimes } from 'node:fs/promises';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { CreateMultipartUploadCommand, S3Client, UploadPartCommand } from '@aws-sdk/client-s3';
import t, { type Test } from 'tap';
import { MIN_PART_SIZE_BYTES, S3ObjectStore, type S3ObjectStoreOptions } from '../../src/store/s3/object-store.js';
import { startS3, startS3Process, type S3Endpoint } from '../../testbed/s3.js';
import { objectStoreContract } from './object-store.contract.js';

const MiB = 1024 * 1024;
const s3 = await startS3(t);

let buckets = 0;
/** A store on a bucket of its own, closed at the test's teardown. */
async function freshStore(t: Test, extra: Partial<S3ObjectStoreOptions> = {}): Promise<{ store: S3ObjectStore; opts: S3ObjectStoreOptions }> {
  const opts = { ...endpointOf(s3), bucket: `b-${++buckets}`, ...extra };
  const store = await S3ObjectStore.open({ ...opts, createBucket: true });
  t.teardown(() => store.close());
  return { store, opts };
}

function endpointOf(e: S3Endpoint): S3ObjectStoreOptions {
  const { endpoint, bucket, region, accessKeyId, secretAccessKey } = e;
  return { endpoint, bucket, region, accessKeyId, secretAccessKey };
}

objectStoreContract(t, 'S3ObjectStore', async () => {
  const opts = { ...endpointOf(s3), bucket: `contract-${++buckets}` };
  return {
    store: await S3ObjectStore.open({ ...opts, createBucket: true }),
    reopen: () => S3ObjectStore.open(opts),
    cleanup: async () => {},
  };
});

/** `total` bytes of random data in chunks of `chunk`, hashed as they go; throws after `failAfter` bytes if set. */
function randomBody(total: number, opts: { chunk?: number; failAfter?: number } = {}) {
  const hash = createHash('sha256');
  const state = { bytes: 0, closed: false, digest: () => hash.digest('hex') };
  const chunk = opts.chunk ?? 256 * 1024;
  async function* body(): AsyncGenerator<Uint8Array> {
    try {
      while (state.bytes < total) {
        if (opts.failAfter !== undefined && state.bytes >= opts.failAfter) throw new Error('body failed midway');
        const c = randomBytes(Math.min(chunk, total - state.bytes));
        hash.update(c);
        state.bytes += c.length;
        yield c;
      }
    } finally {
      state.closed = true;
    }
  }
  return { body: body(), state };
}

async function digestOf(body: AsyncIterable<Uint8Array>): Promise<{ digest: string; size: number }> {
  const hash = createHash('sha256');
  let size = 0;
  for await (const c of body) {
    hash.update(c);
    size += c.byteLength;
  }
  return { digest: hash.digest('hex'), size };
}

const since = (from: number) => s3.requests.slice(from);

t.test('S3ObjectStore: a 32 MiB body is a multipart upload of four 8 MiB parts, read back byte-identical', async (t) => {
  const { store } = await freshStore(t);
  const key = 'big/32mib.ndjson';
  const { body, state } = randomBody(32 * MiB);
  const mark = s3.requests.length;
  t.same(await store.put(key, body), { key, size: 32 * MiB });
  const seen = since(mark).filter((r) => r.key === key);
  const parts = seen.filter((r) => r.method === 'PUT' && 'partNumber' in r.query).map((r) => Number(r.query.partNumber));
  t.same(parts.sort((a, b) => a - b), [1, 2, 3, 4], 'four UploadPart requests of 8 MiB');
  t.equal(seen.filter((r) => r.method === 'POST' && 'uploads' in r.query).length, 1, 'one CreateMultipartUpload');
  t.equal(seen.filter((r) => r.method === 'POST' && 'uploadId' in r.query).length, 1, 'one CompleteMultipartUpload');
  t.equal(seen.filter((r) => r.method === 'PUT' && !('partNumber' in r.query)).length, 0, 'no single PutObject');
  const read = await store.get(key);
  t.ok(read);
  t.same(await digestOf(read!), { digest: state.digest(), size: 32 * MiB }, 'byte-identical');
  t.same(await store.list('big/'), [{ key, size: 32 * MiB }]);
  t.same(await store.listIncompleteUploads(''), [], 'no incomplete upload left');
});

t.test('S3ObjectStore: a body of at most one part is a single PutObject', async (t) => {
  const { store } = await freshStore(t, { partSizeBytes: MIN_PART_SIZE_BYTES });
  const mark = s3.requests.length;
  const { body } = randomBody(MIN_PART_SIZE_BYTES);
  t.same(await store.put('one/part', body), { key: 'one/part', size: MIN_PART_SIZE_BYTES });
  const seen = since(mark).filter((r) => r.key === 'one/part');
  t.equal(seen.length, 1, 'one request');
  t.equal(seen[0]?.method, 'PUT');
  t.notOk(['uploads', 'uploadId', 'partNumber'].some((q) => q in (seen[0]?.query ?? {})), 'not a multipart request');
});

t.test('S3ObjectStore: a body that throws midway leaves no object and no incomplete upload', async (t) => {
  const { store } = await freshStore(t);
  await store.put('mid/old', randomBody(10).body);
  for (const key of ['mid/new', 'mid/old']) {
    const before = (await store.list(key))[0];
    const { body, state } = randomBody(32 * MiB, { failAfter: 20 * MiB });
    const mark = s3.requests.length;
    await t.rejects(store.put(key, body), { message: 'body failed midway' }, `${key}: the body's own error`);
    t.ok(state.closed);
    const seen = since(mark).filter((r) => r.key === key);
    t.ok(seen.some((r) => r.method === 'PUT' && 'partNumber' in r.query), `${key}: parts were uploaded`);
    t.equal(seen.filter((r) => r.method === 'DELETE' && 'uploadId' in r.query).length, 1, `${key}: then the upload was aborted`);
    t.same((await store.list(key))[0], before, `${key}: the object is as it was`);
    t.same(await store.listIncompleteUploads('mid/'), [], `${key}: no incomplete upload`);
  }
  t.equal(await store.get('mid/new'), null);
});

t.test('S3ObjectStore: when the abort fails too, the body error surfaces and the sweep cleans up', async (t) => {
  const { store } = await freshStore(t);
  const key = 'crash/pkg.ndjson';
  const allow = s3.refuse((r) => r.method === 'DELETE' && 'uploadId' in r.query);
  t.teardown(allow);
  const { body } = randomBody(32 * MiB, { failAfter: 20 * MiB });
  await t.rejects(store.put(key, body), { message: 'body failed midway' }, 'not the abort error');
  allow();
  const left = await store.listIncompleteUploads('crash/');
  t.same(
    left.map((u) => u.key),
    [key],
    'what a crashed uploader leaves: an incomplete upload',
  );
  t.equal(await store.get(key), null, 'but no object');
  t.same(await store.abortIncompleteUploads('crash/', 3600_000), [], 'too young for an hour-old sweep');
  t.same(
    (await store.abortIncompleteUploads('crash/', 0)).map((u) => u.uploadId),
    left.map((u) => u.uploadId),
  );
  t.same(await store.listIncompleteUploads(''), []);
});

t.test('S3ObjectStore: a put the server refuses ends the body iterator and rejects', async (t) => {
  // A store on a bucket that does not exist (the constructor does not check; open would).
  const store = new S3ObjectStore({ ...endpointOf(s3), bucket: 'no-such-bucket' });
  t.teardown(() => store.close());
  const { body, state } = randomBody(Number.MAX_SAFE_INTEGER, { chunk: MiB });
  await t.rejects(store.put('k', body), { code: 'STORE_UNAVAILABLE', cause: { name: 'NoSuchBucket' } });
  t.ok(state.closed, 'the caller’s iterator was returned, not left suspended');
  t.ok(state.bytes < 256 * MiB, 'and not read to the end');
});

t.test('S3ObjectStore: the start-up sweep aborts incomplete uploads older than the age', async (t) => {
  const { store, opts } = await freshStore(t);
  const client = new S3Client({
    endpoint: opts.endpoint,
    region: opts.region,
    forcePathStyle: true,
    credentials: { accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey },
  });
  t.teardown(() => client.destroy());
  // What an uploader killed mid-put leaves behind: a created upload with a part, never completed.
  const leave = async (key: string): Promise<string> => {
    const { UploadId } = await client.send(new CreateMultipartUploadCommand({ Bucket: opts.bucket, Key: key }));
    await client.send(new UploadPartCommand({ Bucket: opts.bucket, Key: key, UploadId, PartNumber: 1, Body: randomBytes(1024) }));
    return UploadId!;
  };
  const oldId = await leave('sess/a/old.ndjson');
  const youngId = await leave('sess/a/young.ndjson');
  const otherId = await leave('other/old.ndjson');
  const twoHoursAgo = new Date(Date.now() - 2 * 3600_000);
  for (const id of [oldId, otherId]) {
    await utimes(join(s3.dir, opts.bucket, '._S3rver_uploads', id, 'key'), twoHoursAgo, twoHoursAgo);
  }

  const listed = await store.listIncompleteUploads('sess/');
  t.same(
    listed.map((u) => [u.key, u.uploadId]),
    [
      ['sess/a/old.ndjson', oldId],
      ['sess/a/young.ndjson', youngId],
    ],
  );
  t.ok(listed.every((u) => u.initiated instanceof Date));
  const aborted = await store.abortIncompleteUploads('sess/', 3600_000);
  t.same(
    aborted.map((u) => u.uploadId),
    [oldId],
    'only the one older than an hour',
  );
  t.same(
    (await store.listIncompleteUploads('')).map((u) => u.uploadId).sort(),
    [otherId, youngId].sort(),
    'the young one and the one outside the prefix stay',
  );
  t.same((await store.abortIncompleteUploads('', 0)).length, 2);
  t.same(await store.listIncompleteUploads(''), []);
  await t.rejects(store.abortIncompleteUploads('', -1), RangeError);
});

t.test('S3ObjectStore: list pages and deletePrefix batches past 1000 keys', async (t) => {
  const { store } = await freshStore(t);
  const keys = Array.from({ length: 1001 }, (_, i) => `many/${String(i).padStart(4, '0')}`);
  for (let i = 0; i < keys.length; i += 50) {
    await Promise.all(keys.slice(i, i + 50).map((k) => store.put(k, randomBody(1).body)));
  }
  await store.put('keep/1', randomBody(1).body);
  const mark = s3.requests.length;
  const listed = await store.list('many/');
  t.same(
    listed.map((o) => o.key),
    keys,
  );
  t.equal(since(mark).filter((r) => r.method === 'GET' && r.query['list-type'] === '2').length, 2, 'two pages');
  const markDelete = s3.requests.length;
  await store.deletePrefix('many/');
  t.equal(since(markDelete).filter((r) => r.method === 'POST' && 'delete' in r.query).length, 2, 'two DeleteObjects of at most 1000');
  t.same(await store.list(''), [{ key: 'keep/1', size: 1 }]);
});

t.test('S3ObjectStore.open and options', async (t) => {
  const base = { ...endpointOf(s3), bucket: 'open-bucket' };
  await t.rejects(S3ObjectStore.open(base), { code: 'STORE_MISCONFIGURED' }, 'no bucket, none created');
  const created = await S3ObjectStore.open({ ...base, createBucket: true });
  await created.close();
  const again = await S3ObjectStore.open({ ...base, createBucket: true });
  await again.close();
  await t.rejects(again.list(''), { code: 'STORE_CLOSED' });
  const opened = await S3ObjectStore.open(base);
  await opened.close();

  t.throws(() => new S3ObjectStore({ ...base, partSizeBytes: MiB }), { code: 'STORE_MISCONFIGURED', message: /option partSizeBytes: expected an integer >= 5242880/ });
  t.throws(() => new S3ObjectStore({ ...base, queueSize: 0 }), { code: 'STORE_MISCONFIGURED', message: /option queueSize/ });
  t.throws(() => new S3ObjectStore({ ...base, endpoint: 'ftp://x' }), { code: 'STORE_MISCONFIGURED', message: /option endpoint: expected an http\(s\) URL/ });
  t.throws(() => new S3ObjectStore({ ...base, partSize: 8 * MiB } as S3ObjectStoreOptions), { code: 'STORE_MISCONFIGURED', message: /option partSize: unknown option/ });
  t.throws(() => new S3ObjectStore({ ...base, accessKeyId: null }), { code: 'STORE_MISCONFIGURED', message: /option accessKeyId: expected to be set together/ });
  t.doesNotThrow(() => new S3ObjectStore({ ...base, accessKeyId: null, secretAccessKey: null }), 'both unset: the SDK credential chain');

  const store = new S3ObjectStore(base);
  t.teardown(() => store.close());
  for (const bad of ['', '/abs', 'a//b', 'a/', '../up', 'a/./b']) {
    await t.rejects(store.get(bad), { code: 'STORE_INVALID_KEY' }, `get rejects ${JSON.stringify(bad)}`);
  }
});

t.test('S3ObjectStore: object storage unavailable', async (t) => {
  const server = await startS3Process(t);
  const timeoutMs = 500;
  const opts = { ...endpointOf(server), requestTimeoutMs: timeoutMs, maxAttempts: 2 };
  const store = await S3ObjectStore.open(opts);
  t.teardown(() => store.close());
  await store.put('k/1', randomBody(100).body);
  // Every attempt has its deadline; retries back off by at most a few hundred ms.
  const bound = opts.maxAttempts * timeoutMs + 2000;
  const timed = async <T>(p: Promise<T>): Promise<number> => {
    const start = Date.now();
    await p.then(
      () => t.fail('expected a rejection'),
      () => {},
    );
    return Date.now() - start;
  };

  await t.test('killed: connections refused', async (t) => {
    await server.kill();
    t.ok((await timed(store.put('k/2', randomBody(100).body))) < bound, 'put rejects in time');
    t.ok((await timed(store.list('k/'))) < bound, 'list rejects in time');
    await t.rejects(store.get('k/1'), { code: 'STORE_UNAVAILABLE' }, 'storage unavailable: get');
    await t.rejects(store.put('k/2', randomBody(100).body), { code: 'STORE_UNAVAILABLE' }, 'put');
    await t.rejects(store.list('k/'), { code: 'STORE_UNAVAILABLE' }, 'list');
    await t.rejects(store.deletePrefix('k/'), { code: 'STORE_UNAVAILABLE' }, 'deletePrefix');
    await t.rejects(S3ObjectStore.open(opts), { code: 'STORE_UNAVAILABLE' });
    await server.restart();
    t.same(await store.put('k/2', randomBody(100).body), { key: 'k/2', size: 100 }, 'back on the same port');
    t.same(
      (await store.list('k/')).map((o) => o.key),
      ['k/1', 'k/2'],
      'with the same data',
    );
  });

  await t.test('frozen: accepted but never answered', async (t) => {
    server.pause();
    let resumed = false;
    t.teardown(() => {
      if (!resumed) server.resume();
    });
    const start = Date.now();
    await t.rejects(store.put('k/3', randomBody(100).body), { code: 'STORE_UNAVAILABLE', cause: { name: 'TimeoutError' } });
    const elapsed = Date.now() - start;
    t.ok(elapsed >= timeoutMs && elapsed < bound, `put rejects after its deadline (${elapsed} ms)`);
    await t.rejects(store.get('k/1'), { code: 'STORE_UNAVAILABLE', cause: { name: 'TimeoutError' } }, 'get too');
    server.resume();
    resumed = true;
    t.same(await store.put('k/4', randomBody(100).body), { key: 'k/4', size: 100 }, 'answers again once resumed');
  });
});

t.test('S3ObjectStore: an object whose body stops arriving is object storage unavailable', async (t) => {
  // A server that answers GetObject's head and the first bytes, then nothing (frozen mid-body).
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': '100' });
    res.write('x'.repeat(10));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  const { port } = server.address() as AddressInfo;
  const store = new S3ObjectStore({ endpoint: `http://127.0.0.1:${port}`, bucket: 'b', region: 'us-east-1', accessKeyId: 'a', secretAccessKey: 'b', requestTimeoutMs: 300, maxAttempts: 1 });
  t.teardown(() => store.close());
  const body = await store.get('k/1');
  const read = async () => {
    for await (const chunk of body!) void chunk;
  };
  await t.rejects(read(), { code: 'STORE_UNAVAILABLE' });
});
