/**
 * A real S3 protocol server for tests: s3rver (file-backed) on loopback, port 0, a fresh temp
 * dir, one bucket configured. `startS3` runs it in this process; `startS3Process` in a child
 * process that a test can kill, freeze and start again on the same port and data.
 *
 * `shim` fixes what s3rver 3.7.1 gets wrong for the SDK, ahead of its router and without
 * checking signatures; everything else is s3rver's:
 * - ListMultipartUploads answers 501 and AbortMultipartUpload 405 (jamhall/s3rver#784 is
 *   unmerged), so a failed multipart put could never clean up and no test could see what it
 *   left. Both are served from s3rver's own upload directories
 *   (`<dir>/<bucket>/._S3rver_uploads/<uploadId>/{key,1,2,…}`).
 * - ListObjectsV2 makes its continuation token with DES, which OpenSSL 3 (Node >= 17) no longer
 *   has: every truncated page is a 500. Its listing also follows directory order (`a/b/1`
 *   before `a/b`), which breaks paging. It is served from s3rver's store in S3's key order,
 *   with the last key as token.
 */
import { fork, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, readFile, readdir, rm, stat } from 'node:fs/promises';
import type { Server } from 'node:http';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

interface Teardown {
  teardown(fn: () => unknown): void;
}

export interface S3Endpoint {
  endpoint: string;
  bucket: string;
  accessKeyId: string;
  secretAccessKey: string;
  region: string;
}

/** One request as the server saw it: the object key (URI-decoded, '' for bucket requests) and the query. */
export interface RecordedRequest {
  method: string;
  key: string;
  query: Record<string, string>;
}

export interface S3Server extends S3Endpoint {
  dir: string;
  /** Every request served so far, in arrival order. */
  requests: RecordedRequest[];
  /** The first request that matches, as soon as it arrives (at once if one already did). */
  seen(match: (r: RecordedRequest) => boolean): Promise<RecordedRequest>;
  /** Answers matching requests with an S3 error (default 500 InternalError) until the returned function is called. */
  refuse(match: (r: RecordedRequest) => boolean, answer?: S3ErrorAnswer): () => void;
  stop(): Promise<void>;
}

export interface S3Process extends S3Endpoint {
  dir: string;
  port: number;
  /** SIGKILL: the server is gone, connections are refused. */
  kill(): Promise<void>;
  /** Starts it again on the same port and data (after `kill`). */
  restart(): Promise<void>;
  /** SIGSTOP: connections are still accepted by the kernel but nothing answers. */
  pause(): void;
  /** SIGCONT after `pause`. */
  resume(): void;
}

const CREDENTIALS = { accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER', region: 'us-east-1' } as const;
const DEFAULT_BUCKET = 'test-bucket';

/** The little of Koa's context the shim touches. */
interface KoaContext {
  method: string;
  path: string;
  query: Record<string, string | string[] | undefined>;
  status: number;
  body: unknown;
  type: string;
  store: {
    listObjects(
      bucket: string,
      opts: { prefix?: string },
    ): Promise<{ objects: { key: string; size: number; lastModifiedDate: Date; metadata: { etag?: string } }[] }>;
  };
}
type Middleware = (ctx: KoaContext, next: () => Promise<void>) => Promise<void>;

interface S3rverInstance {
  middleware: Middleware[];
  httpServer?: Server;
  run(): Promise<{ address: string; port: number }>;
  close(): Promise<void>;
}
type S3rverClass = new (options: Record<string, unknown>) => S3rverInstance;

const S3rver = createRequire(import.meta.url)('s3rver') as S3rverClass;

/** An S3 error answer: HTTP status and the `<Code>` of the XML body. */
export interface S3ErrorAnswer {
  status: number;
  code: string;
  message: string;
}

const REFUSED: S3ErrorAnswer = { status: 500, code: 'InternalError', message: 'Refused by the test' };

interface Recorder {
  requests: RecordedRequest[];
  refused: Map<(r: RecordedRequest) => boolean, S3ErrorAnswer>;
  /** Told of every request as it arrives. */
  watchers: Set<(r: RecordedRequest) => void>;
}

async function runS3rver(
  dir: string,
  port: number,
  bucket: string,
  recording?: Recorder,
  address = '127.0.0.1',
): Promise<{ server: S3rverInstance; port: number }> {
  const server = new S3rver({
    address,
    port,
    directory: dir,
    silent: true,
    vhostBuckets: false,
    configureBuckets: [{ name: bucket }],
  });
  // Koa composes its middleware list when the server starts: these run before s3rver's own.
  server.middleware.unshift(shim(dir));
  if (recording) server.middleware.unshift(recorder(recording));
  const listening = await server.run();
  return { server, port: listening.port };
}

/** s3rver in this process; stopped (and its dir removed) at the test's teardown. */
export async function startS3(t: Teardown, opts: { bucket?: string } = {}): Promise<S3Server> {
  const bucket = opts.bucket ?? DEFAULT_BUCKET;
  const dir = await mkdtemp(join(tmpdir(), 's3rver-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const recording: Recorder = { requests: [], refused: new Map(), watchers: new Set() };
  const { server, port } = await runS3rver(dir, 0, bucket, recording);
  let stopped = false;
  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    const closed = server.close();
    // Keep-alive sockets of clients not yet closed would hold close() open.
    server.httpServer?.closeAllConnections();
    await closed;
  };
  t.teardown(stop);
  const refuse = (match: (r: RecordedRequest) => boolean, answer = REFUSED) => {
    recording.refused.set(match, answer);
    return () => void recording.refused.delete(match);
  };
  const seen = (match: (r: RecordedRequest) => boolean) =>
    new Promise<RecordedRequest>((resolve) => {
      const earlier = recording.requests.find(match);
      if (earlier) return resolve(earlier);
      const watcher = (r: RecordedRequest) => {
        if (!match(r)) return;
        recording.watchers.delete(watcher);
        resolve(r);
      };
      recording.watchers.add(watcher);
    });
  return { endpoint: `http://127.0.0.1:${port}`, bucket, ...CREDENTIALS, dir, requests: recording.requests, seen, refuse, stop };
}

/**
 * s3rver in a child process, so that a test can take object storage away and bring it back.
 * `host`: the address it listens on (default 127.0.0.1); `wrap`: a command prefix that runs it
 * on another host (`ip netns exec <ns>`, testbed/netns.ts).
 */
export async function startS3Process(t: Teardown, opts: { bucket?: string; host?: string; wrap?: string[] } = {}): Promise<S3Process> {
  const host = opts.host ?? '127.0.0.1';
  const wrap = opts.wrap ?? [];
  const bucket = opts.bucket ?? DEFAULT_BUCKET;
  const dir = await mkdtemp(join(tmpdir(), 's3rver-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  let child: ChildProcess | undefined;
  let port = 0;

  const alive = (c: ChildProcess | undefined): c is ChildProcess => !!c && c.exitCode === null && c.signalCode === null;
  const start = async (): Promise<void> => {
    const childArgs = [fileURLToPath(import.meta.url), CHILD_FLAG, dir, String(port), bucket, host];
    // The IPC channel is an inherited descriptor and an environment variable, both kept across `ip netns exec`.
    const c = wrap.length
      ? spawn(wrap[0]!, [...wrap.slice(1), process.execPath, ...childArgs], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] })
      : fork(childArgs[0]!, childArgs.slice(1), { stdio: ['ignore', 'ignore', 'inherit', 'ipc'], execArgv: [] });
    child = c;
    const ready = new Promise<number>((resolve, reject) => {
      c.once('message', (m: { port?: number }) => (typeof m?.port === 'number' ? resolve(m.port) : reject(new Error('bad ready message'))));
      c.once('exit', (code, signal) => reject(new Error(`s3rver child exited before it was ready (${code ?? signal})`)));
      c.once('error', reject);
    });
    port = await ready;
  };
  const kill = async (): Promise<void> => {
    const c = child;
    if (!alive(c)) return;
    const exited = once(c, 'exit');
    c.kill('SIGKILL');
    await exited;
  };

  await start();
  t.teardown(kill);
  const handle: S3Process = {
    endpoint: `http://${host}:${port}`,
    bucket,
    ...CREDENTIALS,
    dir,
    port,
    kill,
    async restart() {
      if (alive(child)) throw new Error('s3rver child is still running: kill() it first');
      await start();
    },
    pause() {
      if (alive(child)) child.kill('SIGSTOP');
    },
    resume() {
      if (alive(child)) child.kill('SIGCONT');
    },
  };
  return handle;
}

function recorder({ requests, refused, watchers }: Recorder): Middleware {
  return async (ctx, next) => {
    const query: Record<string, string> = {};
    for (const [k, v] of Object.entries(ctx.query)) query[k] = Array.isArray(v) ? (v[0] ?? '') : (v ?? '');
    const request = { method: ctx.method, key: pathKey(ctx.path).key, query };
    requests.push(request);
    for (const watcher of [...watchers]) watcher(request);
    for (const [match, answer] of refused) if (match(request)) return xmlError(ctx, answer.status, answer.code, answer.message, {});
    await next();
  };
}

function pathKey(path: string): { bucket: string; key: string } {
  const [, bucket = '', ...rest] = path.split('/');
  return { bucket: decodeURIComponent(bucket), key: rest.map((s) => decodeURIComponent(s)).join('/') };
}

/** ListMultipartUploads, AbortMultipartUpload and ListObjectsV2 for s3rver (see the file comment). */
function shim(dir: string): Middleware {
  return async (ctx, next) => {
    const { bucket, key } = pathKey(ctx.path);
    const onBucket = ctx.method === 'GET' && bucket !== '' && key === '';
    const operation =
      onBucket && 'uploads' in ctx.query
        ? listUploads
        : onBucket && ctx.query['list-type'] === '2' && !ctx.query.delimiter
          ? listObjects
          : ctx.method === 'DELETE' && key !== '' && typeof ctx.query.uploadId === 'string'
            ? abortUpload
            : null;
    if (!operation) return next();
    if (!(await exists(join(dir, bucket)))) {
      return xmlError(ctx, 404, 'NoSuchBucket', 'The specified bucket does not exist', { BucketName: bucket });
    }
    await operation(ctx, { bucket, key, uploadsDir: join(dir, bucket, '._S3rver_uploads') });
  };
}

interface Target {
  bucket: string;
  key: string;
  uploadsDir: string;
}

const byKey = (a: { key: string }, b: { key: string }): number => Buffer.compare(Buffer.from(a.key), Buffer.from(b.key));
const text = (v: unknown): string => (typeof v === 'string' ? v : '');

async function abortUpload(ctx: KoaContext, { key, uploadsDir }: Target): Promise<void> {
  const uploadId = text(ctx.query.uploadId);
  const stored = /^[0-9a-f]+$/.test(uploadId) ? await readFile(join(uploadsDir, uploadId, 'key'), 'utf8').catch(() => null) : null;
  if (stored !== key) {
    return xmlError(ctx, 404, 'NoSuchUpload', 'The specified upload does not exist.', { UploadId: uploadId });
  }
  await rm(join(uploadsDir, uploadId), { recursive: true, force: true });
  ctx.status = 204;
  ctx.body = null;
}

async function listObjects(ctx: KoaContext, { bucket }: Target): Promise<void> {
  const prefix = text(ctx.query.prefix);
  const token = text(ctx.query['continuation-token']);
  const after = token ? Buffer.from(token, 'base64url').toString('utf8') : text(ctx.query['start-after']);
  const maxKeys = Math.min(1000, ctx.query['max-keys'] === undefined ? 1000 : Number(ctx.query['max-keys']));
  if (!Number.isInteger(maxKeys) || maxKeys < 0) {
    return xmlError(ctx, 400, 'InvalidArgument', 'Provided max-keys not an integer or within integer range', {});
  }
  const { objects } = await ctx.store.listObjects(bucket, { prefix });
  const rest = objects.filter((o) => o.key.startsWith(prefix) && Buffer.compare(Buffer.from(o.key), Buffer.from(after)) > 0).sort(byKey);
  const page = rest.slice(0, maxKeys);
  const truncated = rest.length > page.length;
  const last = page[page.length - 1];
  const next = truncated && last ? Buffer.from(last.key, 'utf8').toString('base64url') : '';
  ctx.status = 200;
  ctx.type = 'application/xml';
  ctx.body =
    '<?xml version="1.0" encoding="UTF-8"?>\n' +
    '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">' +
    `<Name>${xml(bucket)}</Name><Prefix>${xml(prefix)}</Prefix><KeyCount>${page.length}</KeyCount>` +
    `<MaxKeys>${maxKeys}</MaxKeys><IsTruncated>${truncated}</IsTruncated>` +
    (token ? `<ContinuationToken>${xml(token)}</ContinuationToken>` : '') +
    (next ? `<NextContinuationToken>${next}</NextContinuationToken>` : '') +
    page
      .map(
        (o) =>
          `<Contents><Key>${xml(o.key)}</Key><LastModified>${o.lastModifiedDate.toISOString()}</LastModified>` +
          `<ETag>${xml(o.metadata.etag ?? '')}</ETag><Size>${o.size}</Size><StorageClass>STANDARD</StorageClass></Contents>`,
      )
      .join('') +
    '</ListBucketResult>';
}

async function listUploads(ctx: KoaContext, { bucket, uploadsDir }: Target): Promise<void> {
  const prefix = text(ctx.query.prefix);
  const uploads: { key: string; id: string; initiated: Date }[] = [];
  for (const id of await readdir(uploadsDir).catch(() => [] as string[])) {
    const keyFile = join(uploadsDir, id, 'key');
    const k = await readFile(keyFile, 'utf8').catch(() => null);
    if (k === null || !k.startsWith(prefix)) continue;
    uploads.push({ key: k, id, initiated: (await stat(keyFile)).mtime });
  }
  uploads.sort((a, b) => byKey(a, b) || a.initiated.getTime() - b.initiated.getTime());
  const owner = '<ID>123456789000</ID><DisplayName>S3rver</DisplayName>';
  ctx.status = 200;
  ctx.type = 'application/xml';
  ctx.body =
    '<?xml version="1.0" encoding="UTF-8"?>\n' +
    '<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">' +
    `<Bucket>${xml(bucket)}</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>` +
    `<Prefix>${xml(prefix)}</Prefix><MaxUploads>1000</MaxUploads><IsTruncated>false</IsTruncated>` +
    uploads
      .map(
        (u) =>
          `<Upload><Key>${xml(u.key)}</Key><UploadId>${u.id}</UploadId>` +
          `<Initiator>${owner}</Initiator><Owner>${owner}</Owner>` +
          `<StorageClass>STANDARD</StorageClass><Initiated>${u.initiated.toISOString()}</Initiated></Upload>`,
      )
      .join('') +
    '</ListMultipartUploadsResult>';
}

function xmlError(ctx: KoaContext, status: number, code: string, message: string, extra: Record<string, string>): void {
  ctx.status = status;
  ctx.type = 'application/xml';
  ctx.body =
    '<?xml version="1.0" encoding="UTF-8"?>\n' +
    `<Error><Code>${code}</Code><Message>${xml(message)}</Message>` +
    Object.entries(extra)
      .map(([k, v]) => `<${k}>${xml(v)}</${k}>`)
      .join('') +
    '</Error>';
}

function xml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

// Child-process entry: `node s3.js --s3rver-child <dir> <port> <bucket> [address]`, used by startS3Process.
const CHILD_FLAG = '--s3rver-child';
if (process.argv[2] === CHILD_FLAG && process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const [dir = '', port = '0', bucket = DEFAULT_BUCKET, address = '127.0.0.1'] = process.argv.slice(3);
  const started = await runS3rver(dir, Number(port), bucket, undefined, address);
  // The parent is the only client that matters: go when it does.
  process.on('disconnect', () => process.exit(0));
  process.send?.({ port: started.port });
}
