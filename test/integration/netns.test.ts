/**
 * testbed/netns.ts, the hosts of the network drill: a host reaches another over its network
 * and not over one it is not on; a cut drops what is sent without a word (a connection attempt
 * gets no answer, not a refusal) while the host's other network still works; a heal restores
 * it; the namespaces go with the test, and a crashed run's are removed by the next.
 */
import { execFileSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import t from 'tap';
import { cleanLeftovers, ipBinary, makeTopology, type Host } from '../../testbed/netns.js';

/** A TCP server on `host`, port 7000, that answers `ok` to each connection. */
async function listen(t: { teardown(fn: () => unknown): void }, host: Host): Promise<void> {
  const child: ChildProcess = host.spawn(
    process.execPath,
    ['-e', "require('net').createServer((s) => s.end('ok')).listen(7000, '0.0.0.0', () => console.log('up'))"],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  t.teardown(() => void child.kill('SIGKILL'));
  await once(child.stdout!, 'data');
}

/** From `host`: what a connection to `addr`:7000 gets within `ms` — `ok`, `timeout` or the error code. */
function probe(host: Host, addr: string, ms: number): string {
  const script =
    `const s = require('net').connect(7000, '${addr}'); let got = '';` +
    `s.on('data', (d) => (got += d)); s.on('end', () => { console.log(got); process.exit(0); });` +
    `s.on('error', (e) => { console.log(e.code); process.exit(0); });` +
    `setTimeout(() => { console.log('timeout'); process.exit(0); }, ${ms});`;
  return execFileSync(host.wrap[0]!, [...host.wrap.slice(1), process.execPath, '-e', script], { encoding: 'utf8' }).trim();
}

t.test('hosts, networks, a silent cut and a heal', async (t) => {
  const net = await makeTopology(t, { networks: ['a', 'b'], hosts: { x: ['a', 'b'], y: ['a', 'b'], z: ['b'] }, observer: ['a'] });
  const { x, y, z } = net.hosts as Record<string, Host>;
  await listen(t, y!);
  t.equal(probe(x!, y!.addr('a'), 3000), 'ok', 'x reaches y on network a');
  t.equal(probe(x!, y!.addr('b'), 3000), 'ok', '... and on network b');
  t.equal(probe(z!, y!.addr('b'), 3000), 'ok', 'z reaches y on b');
  t.not(probe(z!, y!.addr('a'), 1000), 'ok', 'z is not on a');

  await net.cut('y', 'a');
  t.equal(probe(x!, y!.addr('a'), 1000), 'timeout', 'a cut drops silently: no answer, no refusal');
  t.equal(probe(x!, y!.addr('b'), 3000), 'ok', "y's other network still works");
  await net.heal('y', 'a');
  t.equal(probe(x!, y!.addr('a'), 3000), 'ok', 'healed');

  await net.cut('y');
  t.equal(probe(z!, y!.addr('b'), 1000), 'timeout', 'a cut of every network');
  await net.heal('y');
  t.equal(probe(z!, y!.addr('b'), 3000), 'ok', 'healed');

  const names = execFileSync(ipBinary()!, ['netns', 'list'], { encoding: 'utf8' });
  t.match(names, new RegExp(`^nsd${process.pid}\\.\\d+-x`, 'm'), 'namespaces named after this run');
  await net.destroy();
  t.notMatch(execFileSync(ipBinary()!, ['netns', 'list'], { encoding: 'utf8' }), x!.ns, 'destroyed');
});

t.test("a crashed run's namespaces are removed by the next run", async (t) => {
  // A pid no process has: the highest the kernel hands out, plus one.
  const gone = Number(execFileSync('cat', ['/proc/sys/kernel/pid_max'], { encoding: 'utf8' })) + 1;
  const ns = `nsd${gone}.1-left`;
  execFileSync(ipBinary()!, ['netns', 'add', ns]);
  t.teardown(() => {
    try {
      execFileSync(ipBinary()!, ['netns', 'del', ns], { stdio: 'ignore' });
    } catch {
      // removed, as it should be
    }
  });
  t.ok((await cleanLeftovers()).includes(ns), 'removed');
  t.notMatch(execFileSync(ipBinary()!, ['netns', 'list'], { encoding: 'utf8' }), ns);
});
