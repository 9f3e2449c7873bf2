/**
 * A NATS node that stops answering while writes to it pile up (a partition, a frozen host):
 * the gateway's connection gives it up within seconds and reconnects to a node it can reach
 * (src/store/nats/connection.ts, `abandonSocket`). nats.js 2.29 on its own waits, before it
 * closes a stale connection, until everything written has left the socket, which through a
 * partition is when the partition heals: the network drill (DRILL_LONG=1, 30 s cuts) saw a
 * gateway stuck on a cut-off node for the whole cut and about 25 s past its heal.
 */
import t from 'tap';
import { connectNats } from '../../src/store/nats/connection.js';
import { startNats } from '../../testbed/nats.js';

/** Far above the 4-6 s a stale connection takes to be noticed (two unanswered pings, 2 s apart). */
const RECONNECT_WITHIN_MS = 20_000;

t.test('a node that stops answering with the send buffer full: reconnected to another node within seconds', async (t) => {
  const a = await startNats(t, { name: 'a' });
  const b = await startNats(t, { name: 'b' });
  const events: string[] = [];
  let reconnected!: (server: string) => void;
  const reconnect = new Promise<string>((resolve) => (reconnected = resolve));
  const h = await connectNats({
    servers: `${a.url},${b.url}`,
    name: 'stale-test',
    requestTimeoutMs: 2000,
    onConnection: (event, server) => {
      events.push(`${event} ${server}`);
      if (event === 'reconnect') reconnected(server);
    },
  });
  const hostPort = (url: string) => `127.0.0.1:${new URL(url).port}`;
  const [stuck, other] = h.nc.getServer() === hostPort(a.url) ? [a, b] : [b, a];

  stuck.pause();
  // 64 MiB the paused server never reads: the socket's buffers fill, as through a partition.
  const chunk = new Uint8Array(512 * 1024);
  for (let i = 0; i < 128; i++) h.nc.publish('fill', chunk);
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<string>((resolve) => (timer = setTimeout(() => resolve('not reconnected'), RECONNECT_WITHIN_MS)));
  const where = await Promise.race([reconnect, late]);
  clearTimeout(timer);
  t.equal(where, hostPort(other.url), `reconnected to the node that answers while the other is paused (${events.join('; ')})`);
  t.same(events.slice(0, 2), [`stale ${hostPort(stuck.url)}`, `disconnect ${hostPort(stuck.url)}`], 'the paused node was found stale and left, and onConnection said so');
  await t.resolves(h.probe(2000), 'JetStream answers on the new connection');

  stuck.resume();
  await h.close();
});
