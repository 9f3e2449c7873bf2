/**
 * The gateway refuses a nats-server older than the supported floor at connect. The server
 * here is a stand-in that speaks the first lines of the NATS protocol and announces
 * 2.9.10 (Debian stable's, end of life): no real one of that version belongs in the suite.
 */
import { createServer, type AddressInfo, type Socket } from 'node:net';
import t from 'tap';
import { connectNats } from '../../src/store/nats/connection.js';

async function announcing(t: { teardown(fn: () => unknown): void }, version: string): Promise<string> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    socket.write(`INFO ${JSON.stringify({ server_id: 'stand-in', server_name: 'stand-in', version, proto: 1, headers: true, max_payload: 1048576 })}\r\n`);
    socket.on('data', (chunk) => {
      if (chunk.toString('latin1').includes('PING')) socket.write('PONG\r\n');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    for (const s of sockets) s.destroy();
    return new Promise((resolve) => server.close(resolve));
  });
  return `nats://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

t.test('a nats-server before 2.10 is refused at connect, with its version named', async (t) => {
  const url = await announcing(t, '2.9.10');
  await t.rejects(connectNats({ servers: url, name: 'floor-test', requestTimeoutMs: 2000 }), {
    code: 'STORE_MISCONFIGURED',
    message: 'nats-server 2.9.10 is not supported: the gateway needs nats-server 2.10.0 or later',
  });
});
