import t from 'tap';
import { OpenHandles } from '../../src/store/embedded/open-handles.js';

/** Handles that say when they were opened and closed. */
function handles(max: number) {
  const events: string[] = [];
  let n = 0;
  const h = new OpenHandles<{ key: string; no: number }>({
    max,
    open: async (key) => {
      n++;
      events.push(`open ${key}#${n}`);
      return { key, no: n };
    },
    close: async (handle) => void events.push(`close ${handle.key}#${handle.no}`),
  });
  // A close happens a few microtasks after its trigger.
  const settle = () => new Promise((resolve) => setImmediate(resolve));
  return { h, events, settle };
}

t.test('at most `max` stay open; the least recently used idle one closes first, one in use never', async (t) => {
  const { h, events, settle } = handles(2);
  await h.use('a', async () => undefined);
  await h.use('b', async () => undefined);
  await h.use('a', async () => undefined); // a is now the most recently used
  let release!: () => void;
  const busy = h.use('c', () => new Promise<void>((resolve) => (release = resolve)));
  await settle();
  t.same(events, ['open a#1', 'open b#2', 'open c#3', 'close b#2'], 'b, least recently used, closed; a kept');
  await h.use('d', async () => undefined);
  await settle();
  t.same(events.slice(4), ['open d#4', 'close a#1'], 'c is in use: a goes instead');
  release();
  await busy;
  await h.closeAll();
  t.same(events.slice(6).sort(), ['close c#3', 'close d#4']);
});

t.test('a failed call retires its handle: it closes once its users are done, and the next use opens afresh', async (t) => {
  const { h, events, settle } = handles(4);
  let release!: () => void;
  const other = h.use('a', () => new Promise<void>((resolve) => (release = resolve)));
  await t.rejects(h.use('a', async () => Promise.reject(new Error('write failed'))), /write failed/);
  await settle();
  t.same(events, ['open a#1'], 'still in use by the other call: not closed yet');
  const fresh = await h.use('a', async (handle) => handle.no);
  t.equal(fresh, 2, 'the next use has a handle of its own');
  release();
  await other;
  await settle();
  t.same(events, ['open a#1', 'open a#2', 'close a#1']);
});

t.test('retire by key: an idle handle closes at once, peek no longer finds it', async (t) => {
  const { h, events, settle } = handles(4);
  await h.use('s/1', async () => undefined);
  await h.use('s/2', async () => undefined);
  await h.use('t/1', async () => undefined);
  t.same(await h.peek('s/1'), { key: 's/1', no: 1 });
  h.retire((k) => k.startsWith('s/'));
  await settle();
  t.same(events.filter((e) => e.startsWith('close')).sort(), ['close s/1#1', 'close s/2#2']);
  t.equal(await h.peek('s/1'), null);
  t.same(await h.peek('t/1'), { key: 't/1', no: 3 });
  await h.closeAll();
});
