/**
 * The batch queue's hand-written pull loop (src/store/nats/batch-queue/puller.ts) against a
 * real nats-server: one message per pull, a stop that does not wait out the pull, a close
 * that hands a delivery already on its way back at once, and a consumer gone.
 */
import t, { type Test } from 'tap';
import { AckPolicy, DeliverPolicy, nanos, RetentionPolicy, StorageType, type Msg } from 'nats';
import { toJsMsg } from 'nats/lib/jetstream/jsmsg.js';
import { connectNats, type NatsHandle } from '../../src/store/nats/connection.js';
import { Puller } from '../../src/store/nats/batch-queue/puller.js';
import { startNats } from '../../testbed/nats.js';

const server = await startNats(t);
let n = 0;

/** A work-queue stream with one durable pull consumer, ack wait 60 s: a redelivery sooner comes from a nak. */
async function rig(t: Test): Promise<{ h: NatsHandle; stream: string; durable: string; publish(body: string): Promise<number> }> {
  const h = await connectNats({ servers: server.url, name: 'puller-test', requestTimeoutMs: 5000 });
  t.teardown(() => h.close());
  const stream = `PULL${++n}_${process.pid}`;
  const durable = 'uploader';
  await h.jsm.streams.add({ name: stream, subjects: [`${stream}.>`], retention: RetentionPolicy.Workqueue, storage: StorageType.File });
  t.teardown(() => h.jsm.streams.delete(stream).catch(() => {}));
  await h.jsm.consumers.add(stream, {
    durable_name: durable,
    ack_policy: AckPolicy.Explicit,
    ack_wait: nanos(60_000),
    deliver_policy: DeliverPolicy.All,
    max_deliver: -1,
  });
  return { h, stream, durable, publish: async (body) => (await h.js.publish(`${stream}.c.x`, Buffer.from(body))).seq };
}

async function until(what: string, check: () => Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

function isMsg(x: Msg | 'pause' | 'retry' | 'late' | null): x is Msg {
  return typeof x === 'object' && x !== null;
}

t.test('one delivery per pull, with the delivery count and stream sequence nats.js reads from it', async (t) => {
  const r = await rig(t);
  const seqs = [await r.publish('a'), await r.publish('b')];
  const puller = new Puller(r.h, r.stream, r.durable, 1000);
  const first = await puller.next();
  t.ok(isMsg(first));
  const jm = toJsMsg(first as Msg);
  t.equal(Buffer.from(jm.data).toString(), 'a');
  t.equal(jm.info.deliveryCount, 1);
  t.equal(jm.info.streamSequence, seqs[0]);
  // One message per pull: the second is not handed out while the first is in hand.
  const info = await r.h.jsm.consumers.info(r.stream, r.durable);
  t.equal(info.num_ack_pending, 1);
  t.equal(info.num_pending, 1);
  jm.nak();
  // A nak hands the message back: both come now, in either order, the nak'ed one a second time.
  const seen = new Map<number, number>();
  for (let i = 0; i < 2; i++) {
    const got = await puller.next();
    t.ok(isMsg(got), `got ${isMsg(got) ? 'a message' : String(got)}`);
    const m = toJsMsg(got as Msg);
    seen.set(m.info.streamSequence, m.info.deliveryCount);
    await r.h.nc.request((got as Msg).reply!, Buffer.from('+ACK'));
  }
  t.same([...seen].sort((a, b) => a[0] - b[0]), [
    [seqs[0], 2],
    [seqs[1], 1],
  ]);
  puller.stop();
  t.equal(await puller.next(), null);
  await puller.close();
});

t.test('stop ends a waiting pull at once, and close hands a delivery already on its way back at once', async (t) => {
  const r = await rig(t);
  // A long pull: stopping must not wait for it to expire.
  const puller = new Puller(r.h, r.stream, r.durable, 30_000);
  const waiting = puller.next();
  await until('the pull to wait on the server', async () => (await r.h.jsm.consumers.info(r.stream, r.durable)).num_waiting === 1);
  puller.stop();
  // Nothing but the stop ends a 30 s pull before the event loop's next turn.
  const first = await Promise.race([waiting, new Promise((resolve) => setImmediate(resolve, 'still waiting'))]);
  t.equal(first, null, 'stopped at once, without waiting out the pull');
  // The pull is still open on the server: a message published now goes to it.
  const seq = await r.publish('late');
  await until('the delivery to the stopped pull', async () => (await r.h.jsm.consumers.info(r.stream, r.durable)).num_ack_pending === 1);
  await puller.close();
  // Nak'ed on close: another puller has it long before the 60 s ack wait.
  const other = new Puller(r.h, r.stream, r.durable, 1000);
  t.teardown(() => other.close());
  const got = await Promise.race([other.next(), new Promise<'late'>((resolve) => setTimeout(() => resolve('late'), 5000))]);
  t.ok(isMsg(got), 'delivered again within 5 s');
  const jm = toJsMsg(got as Msg);
  t.equal(jm.info.streamSequence, seq);
  t.equal(jm.info.deliveryCount, 2);
  jm.ack();
  other.stop();
});

t.test('a consumer deleted under a waiting pull asks the loop to recreate it', async (t) => {
  const r = await rig(t);
  const puller = new Puller(r.h, r.stream, r.durable, 30_000);
  t.teardown(() => puller.close());
  const waiting = puller.next();
  await until('the pull to wait on the server', async () => (await r.h.jsm.consumers.info(r.stream, r.durable)).num_waiting === 1);
  await r.h.jsm.consumers.delete(r.stream, r.durable);
  const got = await Promise.race([waiting, new Promise<'late'>((resolve) => setTimeout(() => resolve('late'), 5000))]);
  t.equal(got, 'retry');
  puller.stop();
});
