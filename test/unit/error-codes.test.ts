/**
 * Walks `ERROR_CODES` (src/errors.ts): every code is documented (HTTP answers in docs/api.md,
 * "Error codes", with their status and fixed message; internal ones in docs/operations.md,
 * "Internal error codes") and reachable (an HTTP code through a factory some module calls,
 * an internal one through an error class some module throws). And the other way round: every
 * error class of the service carries a code of the table, and the docs name no code it lacks.
 * A static check over the sources (src/).
 */
import { readdir, readFile } from 'node:fs/promises';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { ERROR_CODES, errors, MESSAGES, type ErrorCode, type InternalErrorCode } from '../../src/errors.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');

/** Arguments for every factory: a factory added to `errors` without an entry here does not compile. */
const FACTORY_ARGS: { [K in keyof typeof errors]: Parameters<(typeof errors)[K]> } = {
  authRequired: [],
  clientIdMissing: [],
  ipNotAllowed: [],
  sessionNotInitialized: [],
  invalidUploadUuid: [],
  sessionNotFound: [],
  unknownEntity: ['products'],
  invalidSessionStatus: ['UPLOADING', 'STARTED'],
  initConflict: [{ status: 'already_exists', session_status: 'UPLOADING', upload_uuid: 'u', message: 'Upload session already exists' }],
  uploadTasksInProgress: [],
  sessionFull: [10],
  connectorRejected: ['no'],
  invalidPayload: ['Invalid JSON format.'],
  rowsRefused: [[{ row: 0, column: null, message: 'expected 4 values, got 3' }], 1],
  validationFailed: [[{ type: 'missing', loc: ['body', 'date_from'], msg: 'Field required' }]],
  dateBeforeMinimum: ['2020-01-01'],
  noEntities: [],
  workflowNotRunning: [],
  workflowStopFailed: [409],
  connectorError: [500, 'boom'],
  connectorUnreachable: [],
  webhookUnauthorized: [],
  invalidContentLength: [],
  invalidTransferEncoding: [],
  conflictingFraming: [],
  malformedRequest: [],
  invalidHost: [],
  duplicateHeader: ['Content-Type'],
  invalidForwardedFor: [],
  headersTooLarge: [],
  httpVersionNotSupported: [],
  bodyTooLarge: [32 * 1024 * 1024],
  requestTimeout: [],
  rateLimited: [1],
  routeNotFound: [],
  methodNotAllowed: [['GET']],
  unsupportedMediaType: [],
  idempotencyKeyInvalid: [],
  idempotencyKeyInProgress: [],
  idempotencyKeyReused: [],
  notReady: [{ workers: 'failed' }],
  storageUnavailable: [],
  internal: [],
};

const codes = Object.keys(ERROR_CODES) as (keyof typeof ERROR_CODES)[];
const httpCodes = codes.filter((c): c is ErrorCode => ERROR_CODES[c] !== null);
const internalCodes = codes.filter((c): c is InternalErrorCode => ERROR_CODES[c] === null);

async function sources(): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const dir of ['src']) {
    for (const name of await readdir(join(ROOT, dir), { recursive: true })) {
      if (!name.endsWith('.ts') || name.endsWith('.d.ts')) continue;
      const path = join(dir, name);
      out.set(path, await readFile(join(ROOT, path), 'utf8'));
    }
  }
  return out;
}

/** The rows `| \`CODE\` | …` of the part of `text` from `start` to `end`: code → the cells after it. */
function tableRows(text: string, start: string, end: RegExp): Map<string, string[]> {
  const from = text.indexOf(start);
  if (from < 0) throw new Error(`missing section ${start}`);
  const rest = text.slice(from + start.length);
  const section = rest.slice(0, rest.search(end) < 0 ? undefined : rest.search(end));
  const rows = new Map<string, string[]>();
  for (const line of section.split('\n')) {
    const m = /^\| `([A-Z][A-Z0-9_]*)` \|(.*)\|$/.exec(line);
    if (m) rows.set(m[1]!, m[2]!.split(' | ').map((cell) => cell.trim()));
  }
  return rows;
}

t.test('the table: every HTTP code has a status, every fixed message an HTTP code', async (t) => {
  for (const code of httpCodes) t.ok(Number.isInteger(ERROR_CODES[code]) && ERROR_CODES[code] >= 400, code);
  for (const code of Object.keys(MESSAGES)) t.ok(httpCodes.includes(code as ErrorCode), `MESSAGES.${code} is an HTTP code`);
  t.ok(internalCodes.length > 0);
});

t.test('every HTTP code is documented in docs/api.md with its status and fixed message', async (t) => {
  const doc = await readFile(join(ROOT, 'docs/api.md'), 'utf8');
  const rows = tableRows(doc, '**Error codes.**', /\n\*\*|\n#/);
  for (const code of httpCodes) {
    const row = rows.get(code);
    if (!t.ok(row, `${code} has a row`) || !row) continue;
    const [status = '', detail = ''] = row;
    t.equal(Number(/\d{3}/.exec(status)?.[0]), ERROR_CODES[code], `${code}: documented status`);
    const fixed = (MESSAGES as Record<string, string>)[code];
    if (fixed !== undefined) t.ok(detail.includes(`\`${fixed}\``), `${code}: documented message \`${fixed}\``);
  }
  for (const code of rows.keys()) t.ok(httpCodes.includes(code as ErrorCode), `documented ${code} is an HTTP code of the table`);
});

t.test('every internal code is documented in docs/operations.md', async (t) => {
  const doc = await readFile(join(ROOT, 'docs/operations.md'), 'utf8');
  const rows = tableRows(doc, '### Internal error codes', /\n#/);
  for (const code of internalCodes) t.ok(rows.has(code), `${code} has a row`);
  for (const code of rows.keys()) t.ok(internalCodes.includes(code as InternalErrorCode), `documented ${code} is an internal code of the table`);
});

t.test('every HTTP code is reachable: a factory that makes it is called outside errors.ts', async (t) => {
  const files = [...(await sources())].filter(([path]) => path !== join('src', 'errors.ts'));
  const called = (name: string) => files.some(([, text]) => new RegExp(`\\berrors\\.${name}\\(`).test(text));
  const byCode = new Map<string, string[]>();
  for (const name of Object.keys(FACTORY_ARGS) as (keyof typeof errors)[]) {
    const make = errors[name] as (...args: unknown[]) => { code: string };
    const err = make(...FACTORY_ARGS[name]);
    byCode.set(err.code, [...(byCode.get(err.code) ?? []), name]);
    t.ok(called(name), `errors.${name} is called outside errors.ts`);
  }
  for (const code of httpCodes) {
    const factories = byCode.get(code) ?? [];
    t.ok(factories.some(called), `${code}: made by ${factories.join(', ') || 'no factory'}, called somewhere`);
  }
});

t.test('every internal code is reachable: an error class carries it, and some module throws that class', async (t) => {
  const files = await sources();
  const carried = new Map<string, string[]>();
  for (const [path, text] of files) {
    if (path.startsWith(join('src', 'client')) || path.startsWith(join('src', 'cli'))) continue; // the client side has its own codes
    for (const m of text.matchAll(/class (\w+) extends (\w*Error) \{([\s\S]*?)\n\}/g)) {
      const [, name, base, body] = m as unknown as [string, string, string, string];
      // Every error class of the service: on Error, or on another of them (StoreConflictError on StoreError).
      if (name === 'ServiceError' || base === 'ServiceError') continue;
      // A class typed by a list of codes (`readonly code: StoreErrorCode`) carries each code of
      // the list, reached where it is made with that code (`new StoreError('STORE_CLOSED', …)`).
      const listed = /readonly code: (\w+);/.exec(body)?.[1];
      const list = listed && new RegExp(`type ${listed} = \\(typeof (\\w+)\\)\\[number\\]`).exec(text)?.[1];
      if (list) {
        const codes = [...(new RegExp(`const ${list} = \\[([^\\]]*)\\]`).exec(text)?.[1] ?? '').matchAll(/'([A-Z_]+)'/g)].map((c) => c[1]!);
        t.ok(codes.length > 0, `${path}: ${name}'s codes are the literals of ${list}`);
        for (const code of codes) {
          t.ok(code in ERROR_CODES, `${path}: ${name}'s ${code} is in ERROR_CODES`);
          carried.set(code, [...(carried.get(code) ?? []), `${name}('${code}'`]);
        }
        continue;
      }
      const init = /readonly code(?:: \w+)? = ([^;]+);/.exec(body)?.[1]?.replace(/ satisfies \w+$/, '').trim();
      if (!t.ok(init, `${path}: ${name} carries a code`) || !init) continue;
      const code = /^'([A-Z_]+)'$/.exec(init)?.[1] ?? new RegExp(`const ${init} = '([A-Z_]+)'`).exec(text)?.[1];
      if (!t.ok(code, `${path}: ${name}'s code is a literal`) || !code) continue;
      t.ok(code in ERROR_CODES, `${path}: ${name}'s ${code} is in ERROR_CODES`);
      carried.set(code, [...(carried.get(code) ?? []), name]);
    }
  }
  for (const code of internalCodes) {
    const classes = carried.get(code) ?? [];
    const thrown = classes.some((name) => [...files.values()].some((text) => text.includes(name.includes('(') ? `new ${name}` : `new ${name}(`)));
    t.ok(thrown, `${code}: carried by ${classes.join(', ') || 'no class'}, which something throws`);
  }
});

t.test('health, the operator server and the API (handlers and route declarations) take their messages from errors.ts', async (t) => {
  const files = await sources();
  const api = [...files.keys()].filter((path) => dirname(path) === join('src', 'api')).map((path) => path.split(/[\\/]/).join('/'));
  t.ok(api.includes('src/api/openapi-shared.ts') && api.includes('src/api/ingest.ts'), 'the route declarations are checked');
  for (const path of ['src/observability/operator-server.ts', ...api]) {
    const text = files.get(join(...path.split('/')));
    if (!t.ok(text, path) || !text) continue;
    for (const message of Object.values(MESSAGES)) {
      t.notOk(text.includes(`'${message}'`) || text.includes(`\`${message}\``), `${relative('.', path)} does not spell "${message}"`);
    }
  }
});

t.test('413 names its limit: whole MiB as MiB, anything else as exact bytes, never rounded', async (t) => {
  const detail = (bytes: number, inflated?: boolean) => (errors.bodyTooLarge(bytes, inflated).body as { detail: string }).detail;
  t.equal(detail(32 * 1024 * 1024), 'Request body too large (limit 32 MiB)');
  t.equal(detail(1024 * 1024), 'Request body too large (limit 1 MiB)');
  t.equal(detail(256 * 1024 * 1024, true), 'Request body too large (limit 256 MiB once inflated)');
  t.equal(detail(1.5 * 1024 * 1024), 'Request body too large (limit 1572864 bytes)');
  t.equal(detail(1_000_000), 'Request body too large (limit 1000000 bytes)');
  t.equal(detail(1024 * 1024 - 1), 'Request body too large (limit 1048575 bytes)', 'just under 1 MiB is not "1 MiB"');
  t.equal(errors.bodyTooLarge(1024).statusCode, 413);
});
