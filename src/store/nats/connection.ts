/**
 * One NATS connection per process, shared by the JetStream adapters. Reconnects forever
 * (gateways and uploaders outlive NATS restarts and leader moves); every request carries a
 * timeout, so nothing waits on a NATS that does not answer.
 */
import { Socket } from 'node:net';
import { connect, headers, StorageType, type JetStreamClient, type JetStreamManager, type KV, type MsgHdrs, type NatsConnection, type PubAck, type StreamConfig } from 'nats';
import { isStoreError, StoreError } from '../ports.js';

export interface NatsConnectOptions {
  /** Comma-separated server URLs; `nats://user:pass@host:port` or `nats://token@host:port` carry credentials. */
  servers: string;
  /** Connection name shown by the server's monitoring (e.g. `ingest-gateway`). */
  name: string;
  /** Timeout of every JetStream request and publish acknowledgement (`nats.requestTimeoutMs`). */
  requestTimeoutMs: number;
  /** The connection gave a server up (`stale`: it stopped answering pings), lost it, or reconnected; `server` is `host:port`. */
  onConnection?: (event: 'stale' | 'disconnect' | 'reconnect', server: string) => void;
}

/**
 * The oldest nats-server the adapters are written for: 2.10 serialises the clustered
 * expected-last-subject-sequence check (before it, concurrent compare-and-sets of one key
 * on a replicated bucket could all succeed: nats-io/nats-server#4320) and knows
 * `sync_interval`, which every configuration the project ships sets to `always`.
 */
export const SERVER_FLOOR = [2, 10, 0] as const;

/** `version` (`2.10.27`, `2.15.1-beta.2`) is at least `SERVER_FLOOR`. */
export function supportedServer(version: string | undefined): boolean {
  const parts = /^v?(\d+)\.(\d+)\.(\d+)/.exec(version ?? '')?.slice(1).map(Number);
  if (!parts) return false;
  for (let i = 0; i < SERVER_FLOOR.length; i++) if (parts[i] !== SERVER_FLOOR[i]) return parts[i]! > SERVER_FLOOR[i]!;
  return true;
}

/** Timeout of the first connect; later reconnects never give up. */
const CONNECT_TIMEOUT_MS = 5000;
/** Pings to the server this far apart; `STALE_PINGS` of them unanswered end the connection (within 4-6 s). */
const PING_INTERVAL_MS = 2000;
const STALE_PINGS = 2;
/**
 * Ends a stale connection's socket at once. nats.js 2.29 gives a stale connection up by first
 * waiting until everything it wrote has left (an empty write's callback), and only then
 * closing: through a partition the socket's send buffer is full and nothing leaves, so the
 * connection stayed until the partition healed and TCP's backed-off retransmission got
 * through (about 25 s after a 30 s cut), and nothing reconnected to the nodes still
 * reachable meanwhile. Destroyed, the socket closes now (the library's own close handler
 * runs, with the write's callback failed), and the client reconnects. The library's
 * transport is not public; a version without this shape (pinned in package.json) is
 * left to the library's own close.
 */
function abandonSocket(nc: NatsConnection): void {
  const socket = (nc as unknown as { protocol?: { transport?: { socket?: unknown } } }).protocol?.transport?.socket;
  if (socket instanceof Socket) socket.destroy();
}

/** How long `close()` lets in-flight messages drain before it closes hard. */
const DRAIN_TIMEOUT_MS = 5000;

/** What the adapters need of a connection. `requestTimeoutMs` bounds their own requests. */
export interface NatsContext {
  readonly nc: NatsConnection;
  readonly js: JetStreamClient;
  readonly jsm: JetStreamManager;
  readonly requestTimeoutMs: number;
}

export interface NatsHandle extends NatsContext {
  /**
   * Readiness: resolves when the connection is up and JetStream answers `$JS.API.INFO`
   * within `timeoutMs`; rejects at once while the client is disconnected (reconnecting).
   */
  probe(timeoutMs: number): Promise<void>;
  /** Drains (flushes what was published, lets subscriptions finish), then closes. */
  close(): Promise<void>;
}

export async function connectNats(opts: NatsConnectOptions): Promise<NatsHandle> {
  const { requestTimeoutMs } = opts;
  const { servers, auth } = parseServers(opts.servers);
  const nc = await connect({
    servers,
    name: opts.name,
    ...auth,
    timeout: CONNECT_TIMEOUT_MS,
    reconnect: true,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 1000,
    reconnectJitter: 250,
    // A server that stopped answering (cut off, paused) is given up after STALE_PINGS pings
    // PING_INTERVAL_MS apart went unanswered (`abandonSocket`), and the client reconnects to
    // a node it can reach (10 s and 3 before: longer than the network drill's 30 s cuts).
    pingInterval: PING_INTERVAL_MS,
    maxPingOut: STALE_PINGS,
    // nats.js otherwise makes an Error (a stack trace) for every request and publish
    // acknowledgement in case it times out: about 5 % of the gateway's main thread at
    // a few hundred packages a second (CPU profile, bench:packages --engine nats).
    noAsyncTraces: true,
  });
  try {
    const version = nc.info?.version;
    if (!supportedServer(version)) {
      throw new StoreError(
        'STORE_MISCONFIGURED',
        `nats-server ${version ?? '(unknown version)'} is not supported: the gateway needs nats-server ${SERVER_FLOOR.join('.')} or later`,
      );
    }
    // jetstreamManager() asks $JS.API.INFO: fails here, at start, when JetStream is off.
    const jsm = await nc.jetstreamManager({ timeout: requestTimeoutMs });
    const js = nc.jetstream({ timeout: requestTimeoutMs });
    let connected = true;
    void (async () => {
      for await (const s of nc.status()) {
        if (s.type === 'staleConnection') {
          const server = nc.getServer();
          abandonSocket(nc);
          opts.onConnection?.('stale', server);
        } else if (s.type === 'disconnect' || s.type === 'reconnect') {
          connected = s.type === 'reconnect';
          opts.onConnection?.(s.type, String(s.data));
        }
      }
    })().catch(() => {});
    return {
      nc,
      js,
      jsm,
      requestTimeoutMs,
      async probe(timeoutMs) {
        if (nc.isClosed()) throw new StoreError('STORE_UNAVAILABLE', 'NATS connection is closed');
        if (!connected) throw new StoreError('STORE_UNAVAILABLE', 'NATS is disconnected (reconnecting)');
        const answer = await nc.request('$JS.API.INFO', undefined, { timeout: timeoutMs });
        const info = answer.json<{ error?: { description?: string } }>();
        if (info.error) throw new StoreError('STORE_UNAVAILABLE', `JetStream: ${info.error.description ?? 'error'}`);
      },
      async close() {
        if (nc.isClosed()) return;
        let timer: NodeJS.Timeout | undefined;
        const drained = nc.drain().catch(() => undefined);
        const late = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), DRAIN_TIMEOUT_MS)));
        const outcome = await Promise.race([drained, late]);
        clearTimeout(timer);
        // A drain refused (the connection is down, reconnecting) leaves it open, and reconnecting forever.
        if (outcome === 'late' || !nc.isClosed()) await nc.close();
      },
    };
  } catch (err) {
    await nc.close();
    throw err;
  }
}

/** nats.js takes credentials as options, not in the URL: lift them out of the first URL that has them. */
function parseServers(list: string): { servers: string[]; auth: { user?: string; pass?: string; token?: string } } {
  const servers: string[] = [];
  let auth: { user?: string; pass?: string; token?: string } = {};
  for (const raw of list.split(',').map((s) => s.trim()).filter(Boolean)) {
    const withScheme = /^[a-z]+:\/\//i.test(raw) ? raw : `nats://${raw}`;
    let url: URL;
    try {
      url = new URL(withScheme);
    } catch {
      throw new StoreError('STORE_MISCONFIGURED', `Invalid NATS server URL ${JSON.stringify(raw.replace(/\/\/[^@/]*@/, '//***@'))}`);
    }
    if (url.username && !auth.user && !auth.token) {
      const user = decodeURIComponent(url.username);
      auth = url.password ? { user, pass: decodeURIComponent(url.password) } : { token: user };
    }
    servers.push(`${url.protocol}//${url.host}`);
  }
  if (servers.length === 0) throw new StoreError('STORE_MISCONFIGURED', 'No NATS server URL given');
  return { servers, auth };
}

/**
 * JetStream API error codes of "wrong last sequence": a compare-and-set that lost. 10071 on a
 * single server (it names the sequence); 10164 where a clustered stream's leader refuses the
 * proposal (nats-server 2.11 and later).
 */
const JS_WRONG_LAST_SEQUENCE = [10071, 10164];

export function isWrongLastSequence(err: unknown): boolean {
  return JS_WRONG_LAST_SEQUENCE.includes(jsErrorCode(err) ?? 0);
}
/** JetStream API error code of "no message found". */
export const JS_NO_MESSAGE_FOUND = 10037;
export const JS_NO_SUITABLE_PEERS = 10005;
/**
 * "duplicate message id is in process": a publish with this message id is still being stored
 * (the earlier attempt of a re-send, held up by a paused or changing leader). Asked again a
 * moment later the server answers it as a duplicate with the first one's acknowledgement.
 */
export const JS_DUPLICATE_IN_PROCESS = 10158;

/** The JetStream API error code of `err`, or of the NATS error a `STORE_UNAVAILABLE` wraps (`unavailable`). */
export function jsErrorCode(err: unknown): number | undefined {
  const api = (err as { api_error?: { err_code?: unknown } } | null)?.api_error;
  if (typeof api?.err_code === 'number') return api.err_code;
  return err instanceof StoreError && err.code === 'STORE_UNAVAILABLE' ? jsErrorCode(err.cause) : undefined;
}

/** No answer in time, nobody listening, or JetStream unavailable for a moment (a leader moving): worth another try. */
export function isTransient(err: unknown): boolean {
  const api = (err as { api_error?: { code?: unknown; err_code?: unknown } } | null)?.api_error;
  // JetStream out of storage (some of those are 503s) does not pass in a retry budget: the
  // caller's 503 goes at once, with its Retry-After, instead of after the whole budget.
  if (typeof api?.err_code === 'number' && JS_STORAGE_FAILED.has(api.err_code)) return false;
  const code = (err as { code?: unknown } | null)?.code;
  if (code === 'TIMEOUT' || code === '503' || code === 'DISCONNECT' || code === 'CONNECTION_REFUSED' || code === DAMAGED_READ) return true;
  // 10005 "no suitable peers for placement": a cluster still forming (or not enough nodes:
  // then the retry budget runs out with the same error). 10158: our own earlier attempt of
  // the same publish is still in the server's hands.
  return api?.code === 503 || api?.err_code === JS_NO_SUITABLE_PEERS || api?.err_code === JS_DUPLICATE_IN_PROCESS;
}

/**
 * NATS's own "no responders" (not a JetStream API error): nothing listened on the subject (no
 * stream there: deleted, or the server lost its data), so the message was dropped, not stored.
 */
export function isNoResponders(err: unknown): boolean {
  const e = err as { code?: unknown; api_error?: unknown } | null;
  return e?.code === '503' && e.api_error === undefined;
}

/**
 * Reads from NATS in this process whose bytes were not what the service wrote: a value that does
 * not parse (`readJson`), a commit message that does not read as one, a package unlike its
 * CRC-32, a batch answered on another subject (batch-queue/consumer.ts). Each is read or
 * delivered again. The metric `ingest_nats_damaged_reads_total`; none is expected (nats-server
 * issue 7842 makes them in a cluster).
 */
export const damagedReads = { count: 0 };

/** The code of a value read back from NATS that is not the JSON written (`readJson`). */
const DAMAGED_READ = 'NATS_DAMAGED_READ';

/**
 * A value the service wrote as JSON, as read back. Bytes that do not parse were damaged on
 * their way (nats-server checks its own blocks; issue 7842 mixes consumer data with route
 * protocol in a cluster): a transient failure, so a read inside `withRetry` is made again,
 * and one that stays damaged ends as `STORE_UNAVAILABLE` (503), never as a 500.
 */
export function readJson<T>(data: Uint8Array, what: string): T {
  try {
    return JSON.parse(Buffer.from(data).toString('utf8')) as T;
  } catch {
    damagedReads.count++;
    // Not the parser's message: it quotes the bytes, which may be other messages' (clients' rows).
    throw Object.assign(new Error(`${what} read back from NATS is not the JSON written (${data.length} bytes)`), { code: DAMAGED_READ });
  }
}

/** "stream not found": the adapters make their streams at open, so one missing later was lost (deleted, or a server that came back empty). */
export const JS_STREAM_NOT_FOUND = 10059;
/**
 * JetStream errors that say its storage cannot be used (nats-server errors.json): 10077 a write
 * the disk refused ("JetStream store failed"); 10047 "insufficient storage resources" (the
 * server's `max_file_store` spent); 10023 "insufficient resources"; 10002 "resource limits
 * exceeded for account" (an account's JetStream quota spent, as hosted or multi-tenant servers
 * set); 10049 a stream that could not be created (at open, for the same reasons).
 */
const JS_STORAGE_FAILED = new Set([10077, 10047, 10023, 10002, 10049]);

/**
 * Whether `err` means that NATS cannot keep or give back our data for now: a transient failure
 * that outlasted its retries, JetStream refusing for lack of storage, or one of our streams gone.
 * The HTTP answer of such a failure is 503 `Storage temporarily unavailable` (errors.ts), so the
 * adapters raise it as `STORE_UNAVAILABLE` (`unavailable`), never as a missing key or a 500.
 */
export function isUnavailable(err: unknown): boolean {
  if (isTransient(err)) return true;
  const code = jsErrorCode(err);
  return code === JS_STREAM_NOT_FOUND || (code !== undefined && JS_STORAGE_FAILED.has(code));
}

/** `err` as the port reports it: `STORE_UNAVAILABLE` (with the NATS error as its cause) when `isUnavailable`, else unchanged. */
export function unavailable(err: unknown): unknown {
  if (err instanceof StoreError || !isUnavailable(err)) return err;
  const code = jsErrorCode(err);
  const what = code === JS_STREAM_NOT_FOUND ? 'a JetStream stream of the service is gone (deleted, or the server lost its data)' : 'NATS JetStream is unavailable';
  return new StoreError('STORE_UNAVAILABLE', `${what}: ${(err as Error)?.message ?? String(err)}`, { cause: err });
}

/**
 * Runs `attempt` again on transient failures until `budgetMs` is spent; `attempt` gets the
 * time left, to use as its own request timeout. Only for operations that are safe to repeat.
 * What still fails and means NATS cannot be used (`isUnavailable`) is thrown as
 * `STORE_UNAVAILABLE`; anything else (a lost compare-and-set, no such message) as it came.
 */
export async function withRetry<T>(ctx: NatsContext, budgetMs: number, attempt: (timeoutMs: number) => Promise<T>): Promise<T> {
  const deadline = Date.now() + budgetMs;
  for (let n = 0; ; n++) {
    try {
      return await attempt(Math.max(1, Math.min(ctx.requestTimeoutMs, deadline - Date.now())));
    } catch (err) {
      const wait = Math.min(100 * 2 ** n, 1000);
      if (!isTransient(err) || ctx.nc.isClosed() || Date.now() + wait >= deadline) throw unavailable(err);
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }
}

/** The header of a KV delete or purge marker (nats.js KV). */
export const KV_OPERATION = 'KV-Operation';

/** The header of a message's time to live (ADR-43, nats-server 2.11+, streams with `allow_msg_ttl`). */
export const NATS_TTL = 'Nats-TTL';

/**
 * The headers of a KV deletion marker (a tombstone), as nats.js's `kv.delete` writes it; with
 * `ttlSeconds`, one the server removes that long after storing it, as the KV of nats.js's
 * successor writes a purge marker with a TTL (on a stream with history 1 nothing of the key
 * is left then: the key reads as never written).
 */
export function deleteMarker(ttlSeconds?: number): MsgHdrs {
  const h = headers();
  h.set(KV_OPERATION, 'DEL');
  if (ttlSeconds !== undefined) h.set(NATS_TTL, `${ttlSeconds}s`);
  return h;
}

/**
 * A read confirmed by a compare-and-set against it: `attempt` reads, then writes expecting
 * the revision read, and resolves once that write lands (nothing was written since: the read
 * was current). A write refused (`refused`) means the read was older than the key, as a
 * stream leader cut off from its quorum answers for a moment after the partition heals (it
 * cannot land a write): read again after a short pause, until `budgetMs` is spent, then
 * `STORE_UNAVAILABLE`. `attempt` gets the deadline, for its own requests.
 */
export async function confirmedRead<T>(what: string, budgetMs: number, refused: (err: unknown) => boolean, attempt: (deadline: number) => Promise<T>): Promise<T> {
  const deadline = Date.now() + budgetMs;
  for (;;) {
    try {
      return await attempt(deadline);
    } catch (err) {
      if (!refused(err)) throw err;
      if (Date.now() >= deadline) throw new StoreError('STORE_UNAVAILABLE', `${what}: every read for ${budgetMs} ms was older than the key`, { cause: err });
      await new Promise((resolve) => setTimeout(resolve, 50)); // a deposed leader steps down within moments of hearing the new one
    }
  }
}

/**
 * One attempt of a direct get: a replica that does not answer by then (cut off, paused, a
 * lost leader) is passed over for another one, within the caller's retry budget, after
 * `DIRECT_PAUSE_MS` (not the growing pause of `withRetry`: another replica is likely there).
 */
const DIRECT_ATTEMPT_MS = 250;
const DIRECT_PAUSE_MS = 50;

/**
 * `$JS.API.DIRECT.GET` (the stream must allow direct get): answered by any replica, so it
 * keeps answering while a leader is elected; attempts of `DIRECT_ATTEMPT_MS` within
 * `budgetMs`. Null when no message matches. On a replicated stream a follower may answer a
 * moment behind the leader (nats-server has no read-after-write for it): for answers, never
 * for decisions.
 */
export async function directGet(
  ctx: NatsContext,
  stream: string,
  query: { last_by_subj: string } | { seq: number; next_by_subj: string },
  budgetMs: number,
): Promise<{ seq: number; data: Uint8Array; headers: MsgHdrs | undefined } | null> {
  const request = Buffer.from(JSON.stringify(query));
  const deadline = Date.now() + budgetMs;
  for (;;) {
    try {
      const msg = await ctx.nc.request(`$JS.API.DIRECT.GET.${stream}`, request, { timeout: Math.max(1, Math.min(DIRECT_ATTEMPT_MS, deadline - Date.now())) });
      const code = msg.headers?.code ?? 0;
      if (code === 404) return null;
      // 408 and the like: ask again (another replica, perhaps).
      if (code !== 0 && code !== 200) throw Object.assign(new Error(`direct get from ${stream}: ${code} ${msg.headers?.description ?? ''}`), { code: 'TIMEOUT' });
      return { seq: Number(msg.headers?.get('Nats-Sequence')), data: msg.data, headers: msg.headers };
    } catch (err) {
      if (!isTransient(err) || ctx.nc.isClosed() || Date.now() + DIRECT_PAUSE_MS >= deadline) throw unavailable(err);
      await new Promise((resolve) => setTimeout(resolve, DIRECT_PAUSE_MS));
    }
  }
}

/** "stream name already in use with a different configuration": a create met a stream another process made. */
export const JS_STREAM_NAME_IN_USE = 10058;

/**
 * Opens KV bucket `bucket`, making its stream if there is none. nats.js looks for the stream
 * and makes it when it finds none; where another process made it in between and changed it
 * already (`enableStreamFeatures`), the server refuses the make as a different configuration
 * (two gateways started at once on an empty server): the bucket is there, so it is opened again.
 * Told no direct get, nats.js keeps `kv.get` on the stream's leader whatever the stream allows.
 */
export async function openKv(ctx: NatsContext, bucket: string, replicas: number, budgetMs: number): Promise<KV> {
  const open = () => withRetry(ctx, budgetMs, () => ctx.js.views.kv(bucket, { history: 1, replicas, storage: StorageType.File, allow_direct: false }));
  try {
    return await open();
  } catch (err) {
    if (jsErrorCode(err) !== JS_STREAM_NAME_IN_USE) throw err;
    return open();
  }
}

/**
 * Turns on direct get (every replica answers `$JS.API.DIRECT.GET`), atomic batches (2.12+)
 * and per-message TTLs (`Nats-TTL`, 2.11+) for `stream` in one update, and tells which are
 * on. Every process asks for all three on every stream of the service, whether it uses them
 * or not: an update writes the whole configuration as that process last read it, with no
 * compare-and-set, so two processes asking for different ones could each undo the other's. A
 * server that refuses a feature gets the next smaller set; one that drops a field (2.10 reads
 * neither) answers without it.
 */
export async function enableStreamFeatures(ctx: NatsContext, stream: string, budgetMs: number): Promise<StreamFeatures> {
  const on = (config: StreamConfig): StreamFeatures => {
    const more = config as { allow_atomic?: boolean; allow_msg_ttl?: boolean };
    return { direct: config.allow_direct === true, atomic: more.allow_atomic === true, ttl: more.allow_msg_ttl === true };
  };
  const { config } = await withRetry(ctx, budgetMs, () => ctx.jsm.streams.info(stream));
  const now = on(config);
  if (now.direct && now.atomic && now.ttl) return now;
  const all = { allow_direct: true, allow_atomic: true, allow_msg_ttl: true };
  for (const change of [all, { allow_direct: true, allow_msg_ttl: true }, { allow_direct: true, allow_atomic: true }, { allow_direct: true }]) {
    try {
      return on((await withRetry(ctx, budgetMs, () => ctx.jsm.streams.update(stream, { ...config, ...change } as StreamConfig))).config);
    } catch {
      // Refused: the next, smaller change.
    }
  }
  return now;
}

/** The stream features `enableStreamFeatures` turns on. */
export interface StreamFeatures {
  direct: boolean;
  atomic: boolean;
  /** Messages may carry `Nats-TTL` (the server removes each that long after it stored it). */
  ttl: boolean;
}

/**
 * How long an answer waits for a read before the last value read serves: in a leader election
 * no replica of a stream answers reads until a new leader is up (2–10 s).
 */
const ANSWER_WAIT_MS = 300;
/** The oldest last-read value an answer may give: past it, the answer waits for the read (and its 503). */
export const ANSWER_STALE_MS = 30_000;

/**
 * Values as last read (or written), per key, for `answerSoon`: the `size` most recently set.
 * `peek` gives one whatever its age; `recent` only one set within `ANSWER_STALE_MS` (or the age asked).
 */
export class LastRead<V> {
  readonly #values = new Map<string, { value: V; at: number }>();

  constructor(
    private readonly size: number,
    private readonly now: () => number = () => performance.now(),
  ) {}

  set(key: string, value: V): void {
    this.#values.delete(key);
    this.#values.set(key, { value, at: this.now() });
    if (this.#values.size > this.size) this.#values.delete(this.#values.keys().next().value!);
  }

  delete(key: string): void {
    this.#values.delete(key);
  }

  peek(key: string): V | undefined {
    return this.#values.get(key)?.value;
  }

  /** The value set within `maxAgeMs` (default `ANSWER_STALE_MS`), if any. */
  recent(key: string, maxAgeMs = ANSWER_STALE_MS): V | undefined {
    const got = this.#values.get(key);
    return got && this.now() - got.at <= maxAgeMs ? got.value : undefined;
  }
}

/**
 * `fresh`, or, when it has not settled within `ANSWER_WAIT_MS`, what `last()` gives (the value
 * last read, a moment old) if it gives anything; `fresh` then goes on and updates that value.
 * For answers, never for decisions.
 */
export async function answerSoon<T>(fresh: Promise<T>, last: () => T | undefined, waitMs = ANSWER_WAIT_MS): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = Symbol('late');
  const first = await Promise.race([fresh, new Promise<typeof late>((resolve) => (timer = setTimeout(() => resolve(late), waitMs)))]);
  clearTimeout(timer);
  if (first !== late) return first;
  const known = last();
  if (known === undefined) return fresh;
  fresh.catch(() => {}); // it only updates the value last read now
  return known;
}

/**
 * Publishes to JetStream, re-sent on transient failures within `budgetMs`, with a message id
 * unless the message is safe to store twice (a plain put of the same value).
 * The stream's duplicate window turns a re-send of a publish that did land into the original
 * acknowledgement, so a retry never writes twice. A compare-and-set re-sent is another matter:
 * a single nats-server (2.15.1) checks the expected sequence before the message id, so the
 * re-send of one that landed is refused as "wrong last sequence" (a cluster checks the id
 * first: measured, test/contract/nats.test.ts). So a compare-and-set that loses after an
 * attempt of unknown outcome (one that got no answer, or `maybeLanded`: a batch it was in
 * failed without the server's refusal) is looked up (`landedAs`): the subject's first message
 * after the expected sequence is ours, its acknowledgement; else the outcome is unknown
 * (`STORE_UNAVAILABLE`, as for a timeout), since ours may have landed and been replaced since.
 */
export async function publishOnce(
  ctx: NatsContext,
  subject: string,
  data: Uint8Array,
  opts: { msgID?: string; stream: string; budgetMs: number; headers?: () => MsgHdrs; lastSubjectSequence?: number; lastSequence?: number; maybeLanded?: boolean },
): Promise<PubAck> {
  const deadline = Date.now() + opts.budgetMs;
  let unknown = opts.maybeLanded === true;
  try {
    return await withRetry(ctx, opts.budgetMs, async (timeout) => {
      try {
        // Fresh options each time: nats.js writes into the options and headers it is given.
        return await ctx.js.publish(subject, data, {
          ...(opts.msgID ? { msgID: opts.msgID } : {}),
          timeout,
          expect: {
            streamName: opts.stream,
            ...(opts.lastSubjectSequence === undefined ? {} : { lastSubjectSequence: opts.lastSubjectSequence }),
            ...(opts.lastSequence === undefined ? {} : { lastSequence: opts.lastSequence }),
          },
          ...(opts.headers ? { headers: opts.headers() } : {}),
        });
      } catch (err) {
        if (isTransient(err) && !isNoResponders(err)) unknown = true;
        throw err;
      }
    });
  } catch (err) {
    // The server refused it (out of storage), or no stream took it, and no earlier attempt is in doubt: nothing stored.
    if (!unknown && isStoreError(err, 'STORE_UNAVAILABLE') && (jsErrorCode(err) !== undefined || isNoResponders(err.cause))) throw new StoreError('STORE_UNAVAILABLE', err.message, { cause: err.cause, notWritten: true });
    if (!unknown || opts.msgID === undefined || opts.lastSubjectSequence === undefined || !isWrongLastSequence(err)) throw err;
    const ours = await landedAs(ctx, opts.stream, subject, opts.lastSubjectSequence, opts.msgID, Math.max(deadline - Date.now(), ctx.requestTimeoutMs));
    if (ours) return ours;
    throw new StoreError('STORE_UNAVAILABLE', `NATS JetStream: a compare-and-set of unknown outcome on ${subject} (an earlier attempt got no answer)`, { cause: err });
  }
}

/**
 * The acknowledgement of a compare-and-set publish (`msgID`, expecting `after`) if it landed:
 * the subject's first message after `after`, asked of the stream's leader, carries its id.
 * Null when that message is another's or there is none.
 */
async function landedAs(ctx: NatsContext, stream: string, subject: string, after: number, msgID: string, budgetMs: number): Promise<PubAck | null> {
  const next = await withRetry(ctx, budgetMs, async () => {
    try {
      // `next_by_subj` is the server's (2.9+) and nats.js sends it as given; its types list it for direct gets only.
      return await ctx.jsm.streams.getMessage(stream, { seq: after + 1, next_by_subj: subject } as unknown as Parameters<JetStreamManager['streams']['getMessage']>[1]);
    } catch (err) {
      if (jsErrorCode(err) === JS_NO_MESSAGE_FOUND) return null;
      throw err;
    }
  });
  return next?.header.get('Nats-Msg-Id') === msgID ? { stream, seq: next.seq, duplicate: true } : null;
}
