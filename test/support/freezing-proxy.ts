/**
 * A TCP proxy in front of a nats-server that freezes at a chosen moment of the protocol: once
 * armed, the first reply to a request published on a subject `request` matches is passed on,
 * then nothing more goes either way and new connections are dropped: a NATS that stopped
 * answering right after that reply (a server stopped with SIGSTOP, a host that hangs).
 *
 * As with a stopped server, what clients send meanwhile is not lost: it waits, and `thaw`
 * hands it to the server, in order (a connection its client closed meanwhile is then ended,
 * as the kernel would hand the server the bytes and then the close), and the proxy passes
 * everything again.
 */
import { createServer, connect, type AddressInfo, type Socket } from 'node:net';

export interface FreezingProxy {
  /** `nats://127.0.0.1:<port>` of the proxy. */
  readonly url: string;
  /** Freezes right after the reply to the next request on a subject `request` matches. */
  arm(request: RegExp): void;
  /** Resolves once frozen. */
  readonly frozen: Promise<void>;
  /** Hands the server what clients sent while frozen, then passes everything again. */
  thaw(): void;
}

export async function freezingProxy(t: { teardown(fn: () => unknown): void }, target: string): Promise<FreezingProxy> {
  const port = Number(new URL(target).port);
  let armed: RegExp | null = null;
  let inbox: string | null = null;
  let isFrozen = false;
  let onFrozen!: () => void;
  const frozen = new Promise<void>((resolve) => (onFrozen = resolve));
  const sockets = new Set<Socket>();
  /** Per connection: what to do at `thaw`. */
  const thawing = new Set<() => void>();
  const server = createServer((client) => {
    if (isFrozen) return void client.destroy();
    const upstream = connect(port, '127.0.0.1');
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
    }
    let sent = '';
    /** Sent by the client while frozen, for the server at `thaw`. */
    const waiting: Buffer[] = [];
    let clientGone = false;
    client.on('data', (d: Buffer) => {
      if (isFrozen) return void waiting.push(d);
      if (armed && inbox === null) {
        sent = (sent + d.toString('latin1')).slice(-65536);
        for (const m of sent.matchAll(/PUB (\S+) (_INBOX\.\S+) /g)) if (armed.test(m[1]!)) inbox = m[2]!;
      }
      upstream.write(d);
    });
    let held = Buffer.alloc(0);
    upstream.on('data', (d: Buffer) => {
      if (isFrozen) return;
      if (inbox === null) return void client.write(d);
      // Pass on everything up to the end of the reply to `inbox`, then freeze.
      held = Buffer.concat([held, d]);
      const text = held.toString('latin1');
      const m = new RegExp(`H?MSG ${inbox.replace(/[.]/g, '\\.')} \\S+(?: \\S+)? (\\d+)\\r\\n`).exec(text);
      if (!m) return;
      const end = m.index + m[0].length + Number(m[1]) + 2;
      if (held.length < end) return;
      client.write(held.subarray(0, end));
      isFrozen = true;
      onFrozen();
    });
    thawing.add(() => {
      for (const d of waiting.splice(0)) upstream.write(d);
      if (clientGone) upstream.end();
    });
    const close = () => {
      client.destroy();
      // Frozen, the server has yet to read what the client sent: the connection stays for `thaw`.
      if (isFrozen) clientGone = true;
      else upstream.destroy();
    };
    client.on('error', close);
    upstream.on('error', () => {
      client.destroy();
      upstream.destroy();
    });
    client.on('close', close);
    upstream.on('close', () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    for (const s of sockets) s.destroy();
    server.close();
  });
  return {
    url: `nats://127.0.0.1:${(server.address() as AddressInfo).port}`,
    arm: (request) => void (armed = request),
    frozen,
    thaw: () => {
      isFrozen = false;
      armed = null;
      inbox = null;
      for (const run of thawing) run();
      thawing.clear();
    },
  };
}
