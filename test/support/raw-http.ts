/**
 * HTTP over a plain TCP socket, for tests where the exact bytes matter (framing, limits,
 * timeouts): a client that writes exactly what it is told, and a parser of what came back.
 */
import { connect, type Socket } from 'node:net';
import { DEMO } from './harness.js';

export interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** Every complete final (non-1xx) response in the bytes received so far, in order. */
export function parseResponses(text: string): RawResponse[] {
  const out: RawResponse[] = [];
  let rest = text;
  for (;;) {
    const end = rest.indexOf('\r\n\r\n');
    if (end < 0) return out;
    const lines = rest.slice(0, end).split('\r\n');
    const status = Number(lines[0]!.split(' ')[1]);
    const headers: Record<string, string> = {};
    for (const line of lines.slice(1)) {
      const i = line.indexOf(':');
      headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
    }
    rest = rest.slice(end + 4);
    if (status >= 100 && status < 200) continue;
    const length = Number(headers['content-length'] ?? 0);
    if (rest.length < length) return out;
    out.push({ status, headers, body: rest.slice(0, length) });
    rest = rest.slice(length);
  }
}

/** The first final (non-1xx) response out of the bytes received so far. */
export function parseResponse(text: string): RawResponse | null {
  return parseResponses(text)[0] ?? null;
}

/** A plain TCP client: writes exactly what it is told, records what comes back and when the server closes. */
export class RawClient {
  text = '';
  closed = false;
  readonly sock: Socket;
  private wake: () => void = () => {};

  constructor(t: { teardown(fn: () => unknown): void }, base: string) {
    const { hostname, port } = new URL(base);
    this.sock = connect(Number(port), hostname);
    this.sock.setNoDelay(true);
    t.teardown(() => this.sock.destroy());
    this.sock.on('data', (d: Buffer) => {
      this.text += d.toString('latin1');
      this.wake();
    });
    this.sock.on('close', () => {
      this.closed = true;
      this.wake();
    });
    this.sock.on('error', () => {}); // writes after the server closed: 'close' follows
  }

  /** Resolves with `probe()` once it is truthy; bounded by `timeoutMs`. */
  async until<T>(probe: () => T | null | undefined | false, what: string, timeoutMs = 5000): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const value = probe();
      if (value) return value;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`timed out waiting for ${what}; received ${JSON.stringify(this.text.slice(0, 200))}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  }

  response(timeoutMs?: number): Promise<RawResponse> {
    return this.until(() => parseResponse(this.text), 'a response', timeoutMs);
  }

  closedByServer(timeoutMs?: number): Promise<true> {
    return this.until(() => this.closed, 'the server to close the connection', timeoutMs);
  }

  /** Writes, and waits for the socket to drain or close: never buffers unboundedly. */
  async write(data: string | Buffer): Promise<void> {
    if (this.closed) return;
    if (this.sock.write(data)) return;
    await new Promise<void>((resolve) => {
      const done = () => {
        this.sock.off('drain', done);
        this.sock.off('close', done);
        resolve();
      };
      this.sock.on('drain', done);
      this.sock.on('close', done);
    });
  }
}

export const auth = `Authorization: ${DEMO.token}\r\nClient-Id: ${DEMO.id}\r\n`;
export const head = (method: string, path: string, extra = '') => `${method} ${path} HTTP/1.1\r\nHost: test\r\n${extra}\r\n`;
