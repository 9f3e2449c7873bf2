/**
 * Runs the `ingest` command line as a child process (`node dist/src/cli/ingest.js …`)
 * against a started service, with credentials in the environment and a HOME of its own
 * (so the remembered session and the default config file are the test's), and reads back
 * what the service stored.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { ObjectStore } from '../../src/store/ports.js';
import { DEMO, tempDir, waitForStatus, type Service } from './harness.js';

export const CLI = fileURLToPath(new URL('../../src/cli/ingest.js', import.meta.url));

export interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
  /** stdout parsed as JSON when it is one JSON value (--json), else undefined. */
  json: any;
}

interface Teardown {
  teardown(fn: () => unknown): void;
}

export interface CliRunner {
  home: string;
  /** `input`: written to the command's standard input (else it has none). */
  run(args: string[], opts?: { env?: Record<string, string | undefined>; timeoutMs?: number; input?: string }): Promise<CliRun>;
}

/** A runner with its own HOME; the service's URL and the demo client's credentials in the environment. */
export async function cliRunner(t: Teardown, svc: { url: string }): Promise<CliRunner> {
  const home = await tempDir(t, 'ingest-cli-home-');
  return {
    home,
    run(args, opts = {}) {
      const env: Record<string, string> = { PATH: process.env.PATH ?? '', HOME: home, INGEST_URL: svc.url, INGEST_CLIENT_ID: DEMO.id, INGEST_TOKEN: DEMO.token };
      for (const [k, v] of Object.entries(opts.env ?? {})) {
        if (v === undefined) delete env[k];
        else env[k] = v;
      }
      return runCli(args, env, opts.timeoutMs ?? 120_000, opts.input);
    },
  };
}

export function runCli(args: string[], env: Record<string, string>, timeoutMs: number, input?: string): Promise<CliRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], { env, stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
    if (input !== undefined) child.stdin!.end(input);
    let stdout = '';
    let stderr = '';
    child.stdout!.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`ingest ${args.join(' ')} did not end within ${timeoutMs} ms\nstdout: ${stdout}\nstderr: ${stderr}`));
    }, timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      let json: unknown;
      try {
        json = stdout.trim() ? JSON.parse(stdout) : undefined;
      } catch {
        json = undefined;
      }
      resolve({ code, stdout, stderr, json });
    });
  });
}

export interface StoredPackage {
  key: string;
  header: { entity: string; columns: string[]; rows: number; package_id: string };
  rows: unknown[][];
}

/** Waits until every package of the session is stored, then reads each object back. */
export async function storedPackages(svc: Service, uuid: string, opts: { headersOnly?: boolean } = {}): Promise<StoredPackage[]> {
  await waitForStatus(svc, uuid, (s) => s.upload_tasks_finished, undefined, 120_000);
  const objects = await svc.openObjects();
  try {
    const out: StoredPackage[] = [];
    for (const { key } of await objects.list(`${svc.config.storage.objectPrefix}/${encodeURIComponent(DEMO.id)}/${uuid}/`)) {
      out.push(await readObject(objects, key, opts.headersOnly ?? false));
    }
    return out;
  } finally {
    await objects.close();
  }
}

async function readObject(objects: ObjectStore, key: string, headersOnly: boolean): Promise<StoredPackage> {
  const body = await objects.get(key);
  if (!body) throw new Error(`object ${key} vanished`);
  const chunks: Buffer[] = [];
  for await (const chunk of body) {
    chunks.push(Buffer.from(chunk));
    if (headersOnly && chunk.includes(0x0a)) break;
  }
  const text = Buffer.concat(chunks).toString('utf8');
  const lines = text.split('\n');
  const header = JSON.parse(lines[0]!) as StoredPackage['header'];
  const rows = headersOnly ? [] : lines.slice(1).filter((l) => l !== '').map((l) => JSON.parse(l) as unknown[]);
  return { key, header, rows };
}

/** Every stored row as an object keyed by its package's columns. */
export function rowObjects(packages: StoredPackage[]): Record<string, unknown>[] {
  return packages.flatMap((p) => p.rows.map((r) => Object.fromEntries(p.header.columns.map((c, i) => [c, r[i]]))));
}
