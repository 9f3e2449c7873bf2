/**
 * What the tests and the bench share about the processes they start: the webhook secret,
 * temporary directories, and the HTTP edge of `TEST_HTTP_ENGINE`. Compiled by both the
 * main build (tests) and `bench/tsconfig.json`; nothing here depends on tap.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Config, DeepPartial } from '../src/config/config.js';

export const WEBHOOK_SECRET = 'test-webhook-secret-0123456789';

/** What a tap test (or the bench's own stand-in) offers: cleanups run at its end. */
export interface Teardown {
  teardown(fn: () => unknown): void;
}

export async function tempDir(t: Teardown, name = 'ingest-'): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), name));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * `TEST_HTTP_ENGINE=node` (or `uws`) runs the same suites on that HTTP edge; unset, the
 * configuration's default (`auto`) chooses.
 */
export const HTTP_ENGINE = ((): Config['http']['engine'] | null => {
  const engine = process.env.TEST_HTTP_ENGINE;
  if (engine === undefined || engine === '') return null;
  if (engine !== 'node' && engine !== 'uws' && engine !== 'auto') throw new Error(`TEST_HTTP_ENGINE: expected node, uws or auto, got ${engine}`);
  return engine;
})();

/** The configuration every started service gets: the HTTP edge of `TEST_HTTP_ENGINE`. */
export function edgeConfig(): DeepPartial<Config> {
  return HTTP_ENGINE === null ? {} : { http: { engine: HTTP_ENGINE } };
}
