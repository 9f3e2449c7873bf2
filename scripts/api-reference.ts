#!/usr/bin/env node
/**
 * Renders docs/api-reference.md from the OpenAPI document the service serves
 * (`openApiDocument()` of src/api/openapi.ts, every operation it may route, each from its
 * route's declaration), so the reference in the repository cannot drift from
 * `GET /openapi.json`: `test/unit/api-reference.test.ts` fails while the committed file
 * differs from this rendering. `npm run docs:api` writes it anew.
 */
import { realpathSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { openApiDocument } from '../src/api/openapi.js';

type Json = Record<string, any>;

/** The file this script writes, relative to the repository root. */
export const API_REFERENCE = 'docs/api-reference.md';

const METHODS = ['get', 'post', 'put', 'patch', 'delete'] as const;

/** Markdown table cells: no line breaks, no bare pipes. */
const cell = (text: string): string => text.replace(/\|/g, '\\|').replace(/\n+/g, '<br>');

const refName = (ref: string): string => ref.slice(ref.lastIndexOf('/') + 1);

/** The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as dashes. */
const anchor = (heading: string): string =>
  heading
    .toLowerCase()
    .replace(/[^a-z0-9 _-]/g, '')
    .replace(/ /g, '-');

const schemaLink = (name: string): string => `[\`${name}\`](#${anchor(name)})`;

const alternatives = (types: string[]): string => [...types].sort().join(' \\| ');

/** A schema as a short type expression, linking named schemas to their section. */
function typeOf(schema: Json | undefined): string {
  if (!schema) return 'any';
  if (schema.$ref) return schemaLink(refName(schema.$ref));
  if (schema.const !== undefined) return `\`${JSON.stringify(schema.const)}\``;
  // Alternatives sorted: typia emits a union's members in no fixed order from build to build.
  if (schema.enum) return alternatives((schema.enum as unknown[]).map((v) => `\`${JSON.stringify(v)}\``));
  for (const key of ['anyOf', 'oneOf'] as const) {
    if (schema[key]) return alternatives((schema[key] as Json[]).map(typeOf));
  }
  if (schema.type === 'array') return `array of ${typeOf(schema.items)}`;
  if (Array.isArray(schema.type)) return (schema.type as string[]).join(' \\| ');
  if (schema.type === 'object' && !schema.properties) return 'object';
  return schema.type ?? 'any';
}

/** Facts a type expression leaves out: bounds, formats, defaults. */
function constraints(schema: Json): string[] {
  const facts: string[] = [];
  const say = (key: string, text: (v: any) => string) => schema[key] !== undefined && facts.push(text(schema[key]));
  say('format', (v) => `format ${v}`);
  say('pattern', (v) => `pattern \`${v}\``);
  say('minimum', (v) => `≥ ${v}`);
  say('maximum', (v) => `≤ ${v}`);
  say('minLength', (v) => `at least ${v} character${v === 1 ? '' : 's'}`);
  say('maxLength', (v) => `at most ${v} characters`);
  say('minItems', (v) => `at least ${v} item${v === 1 ? '' : 's'}`);
  say('default', (v) => `default \`${JSON.stringify(v)}\``);
  return facts;
}

function describe(schema: Json): string {
  const facts = constraints(schema);
  return [schema.description ?? '', facts.length ? `(${facts.join('; ')})` : ''].filter(Boolean).join(' ');
}

/** An object schema on one line: `{a: type, b?: type}` (`?`: optional). */
function shape(schema: Json): string {
  const required = new Set<string>(schema.required ?? []);
  const fields = Object.entries(schema.properties as Json).map(([f, p]) => `\`${f}\`${required.has(f) ? '' : '?'}: ${typeOf(p)}`);
  if (schema.additionalProperties) fields.push(`*any other*: ${typeOf(schema.additionalProperties)}`);
  return `{${fields.join(', ')}}`;
}

/** A field's notes, by field and text, to the schema that first gave them: a later schema with the same notes names it instead. */
type NotesSeen = Map<string, string>;

function schemaSection(name: string, schema: Json, seen: NotesSeen): string[] {
  const out = [`### ${name}`, ''];
  const lead = schema.description ? `${schema.description} ` : '';
  if (schema.type === 'object' && schema.properties) {
    out.push(`${lead}${shape(schema)}`, '');
    const repeated = new Map<string, string[]>();
    for (const [field, prop] of Object.entries(schema.properties as Json)) {
      const notes = describe(prop as Json);
      if (!notes) continue;
      const key = `${field}\n${notes}`;
      const first = seen.get(key);
      if (first === undefined) {
        seen.set(key, name);
        out.push(`- \`${field}\`: ${notes}`);
      } else repeated.set(first, [...(repeated.get(first) ?? []), `\`${field}\``]);
    }
    for (const [first, fields] of repeated) out.push(`- ${fields.join(', ')}: as in ${schemaLink(first)}.`);
  } else if (schema.type === 'object' && schema.additionalProperties) {
    out.push(`${lead}An object; each value is ${typeOf(schema.additionalProperties)}.`);
  } else {
    out.push(`${lead}${typeOf(schema)}${constraints(schema).length ? ` (${constraints(schema).join('; ')})` : ''}`);
  }
  out.push('');
  return out;
}

/** A parameter object, with `$ref`s into components resolved. */
function parameter(doc: Json, p: Json): Json {
  return p.$ref ? doc.components.parameters[refName(p.$ref)] : p;
}

function response(doc: Json, r: Json): Json {
  return r.$ref ? doc.components.responses[refName(r.$ref)] : r;
}

interface Operation {
  path: string;
  method: string;
  op: Json;
}

/** A message of an error response: a line `- ...` of its description. Its head is its leading code span (the message itself). */
const head = (bullet: string): string => (bullet.startsWith('`') ? /^`[^`]*`/.exec(bullet)![0] : bullet);

/** Messages several responses carry: named by their head (the message) in each operation; docs/api.md explains each. */
function commonMessages(doc: Json, operations: Operation[]): Map<string, Set<string>> {
  const messages = new Map<string, Set<string>>();
  const seen = new Map<string, number>();
  for (const { op } of operations) {
    for (const [status, raw] of Object.entries(op.responses as Json)) {
      for (const line of (response(doc, raw).description as string).split('\n')) {
        if (!line.startsWith('- ')) continue;
        const bullet = line.slice(2);
        seen.set(bullet, (seen.get(bullet) ?? 0) + 1);
        if (!messages.has(bullet)) messages.set(bullet, new Set());
        messages.get(bullet)!.add(status);
      }
    }
  }
  for (const bullet of [...messages.keys()]) if (seen.get(bullet)! < 2 || head(bullet) === bullet) messages.delete(bullet);
  return messages;
}

/** Parameters (`$ref`s into components) that three operations or more take: described once ("Common parameters"), named in each. */
function commonParameters(operations: Operation[]): Set<string> {
  const uses = new Map<string, number>();
  for (const { op } of operations) for (const p of (op.parameters ?? []) as Json[]) if (p.$ref) uses.set(p.$ref, (uses.get(p.$ref) ?? 0) + 1);
  return new Set([...uses].filter(([, n]) => n >= 3).map(([ref]) => ref));
}

const paramRow = (p: Json): string =>
  `| \`${p.name}\` | ${p.in} | ${p.required ? 'yes' : 'no'} | ${typeOf(p.schema)} | ${cell(describe({ ...p.schema, description: p.description }))} |`;

/** Each entry of `security` is one way to pass, its schemes all needed; `{}` passes with none. */
const authentication = (security: Json[]): string =>
  security.map((req) => Object.keys(req).map((s) => `\`${s}\``).join(' + ') || 'none').join(', or ') || 'none';

function operationSection(doc: Json, o: Operation, common: Map<string, Set<string>>, standard: Set<string>, commonParams: Set<string>): string[] {
  const { method, path, op } = o;
  const auth = op.security === undefined ? '' : ` Authentication: ${authentication(op.security)}.`;
  const out = [`### ${method.toUpperCase()} ${path}`, '', `**${op.summary}** (\`${op.operationId}\`).${auth}`, ''];
  if (op.description) out.push(op.description, '');
  const params = (op.parameters ?? []) as Json[];
  const own = params.filter((p) => !commonParams.has(p.$ref));
  const shared = params.filter((p) => commonParams.has(p.$ref)).map((p) => parameter(doc, p));
  if (shared.length) out.push(`${shared.length === 1 ? 'Parameter' : 'Parameters'} ${shared.map((p) => `[\`${p.name}\`](#common-parameters) (${p.in})`).join(', ')}.`, '');
  if (own.length) {
    out.push('| parameter | in | required | type | notes |', '|---|---|---|---|---|');
    for (const raw of own) out.push(paramRow(parameter(doc, raw)));
    out.push('');
  }
  const body = op.requestBody?.content?.['application/json'];
  if (body) {
    out.push(`Request body (\`application/json\`${op.requestBody.required ? ', required' : ''}): ${typeOf(body.schema)}.`, '');
    const examples: [string, unknown][] = body.example !== undefined ? [['Example', body.example]] : Object.values((body.examples ?? {}) as Json).map((e: Json) => [e.summary, e.value]);
    for (const [label, value] of examples) out.push(`${label}: \`${JSON.stringify(value)}\``, '');
  }
  const rows = responseRows(doc, o, common);
  const standardOnes = rows.filter((r) => standard.has(r.row));
  const ownRows = rows.filter((r) => !standard.has(r.row));
  if (ownRows.length) out.push('| status | meaning |', '|---|---|', ...ownRows.map((r) => r.row), '');
  if (standardOnes.length) out.push(`${ownRows.length ? 'Also' : 'Answers'} ${standardOnes.map((r) => r.status).join(', ')} as in [Standard answers](#standard-answers).`, '');
  return out;
}

/** The rows of an operation's responses table: `| status | meaning |`. */
function responseRows(doc: Json, o: Operation, common: Map<string, Set<string>>): { status: string; row: string }[] {
  return Object.entries(o.op.responses as Json).map(([status, raw]) => {
    const r = response(doc, raw);
    const content = Object.entries((r.content ?? {}) as Json);
    const bodies = content
      .map(([type, c]) => (type === 'application/json' ? typeOf(c.schema) : `\`${type}\``))
      .filter((b) => b !== schemaLink('ErrorDetail'))
      .join(', ');
    const lines = (r.description as string)
      .split('\n')
      .filter((line) => line.trim() !== '')
      .map((line) => (line.startsWith('- ') ? (common.has(line.slice(2)) ? head(line.slice(2)) : line.slice(2)) : line));
    const headers = Object.keys((r.headers ?? {}) as Json);
    if (headers.length) lines.push(`Headers: ${headers.map((h) => `\`${h}\``).join(', ')}.`);
    return { status, row: `| ${status} | ${bodies ? `${bodies}: ` : ''}${cell(lines.join('\n'))} |` };
  });
}

/** Per status, the response row that most operations give word for word (three at least): written once ("Standard answers"), named by status in each. */
function standardRows(doc: Json, operations: Operation[], common: Map<string, Set<string>>): Set<string> {
  const counts = new Map<string, number>();
  for (const o of operations) for (const { row } of responseRows(doc, o, common)) counts.set(row, (counts.get(row) ?? 0) + 1);
  // One row per status (the most common one): "Also 403" must name one meaning.
  const best = new Map<string, [string, number]>();
  for (const [row, n] of counts) {
    const status = row.split(' | ')[0]!;
    if (n >= 3 && n > (best.get(status)?.[1] ?? 0)) best.set(status, [row, n]);
  }
  return new Set([...best.values()].map(([row]) => row));
}

/** The whole page, from an OpenAPI 3.1 document as `openApiDocument()` builds it. */
export function renderApiReference(doc: Json = openApiDocument() as Json): string {
  const operations: Operation[] = Object.entries(doc.paths as Json).flatMap(([path, item]) =>
    METHODS.filter((m) => (item as Json)[m]).map((method) => ({ path, method, op: (item as Json)[method] as Json })),
  );
  const common = commonMessages(doc, operations);
  const standard = standardRows(doc, operations, common);
  const commonParams = commonParameters(operations);
  const out = [
    '# API reference',
    '',
    `<!-- Generated by scripts/api-reference.ts from the OpenAPI document the service serves; do not edit. Run \`npm run docs:api\` after changing a route's declaration (src/api/) or the document's frame (src/api/openapi.ts). -->`,
    '',
    `${doc.info.title}, version ${doc.info.version}: every operation of \`GET /openapi.json\`, rendered; the rules behind it and what each message means: [api.md](api.md#status-codes-and-messages).`,
    '',
    `Unless an operation says otherwise it needs ${authentication(doc.security)} and its error bodies are [\`ErrorDetail\`](#errordetail); \`?\` marks an optional field.`,
    '',
    '## Authentication',
    '',
    '| scheme | how |',
    '|---|---|',
    ...Object.entries(doc.components.securitySchemes as Json).map(
      ([name, s]) => `| \`${name}\` | ${cell(s.type === 'apiKey' ? `header \`${s.name}\`: ${s.description}` : `HTTP ${s.scheme}: ${s.description}`)} |`,
    ),
    '',
    '## Standard answers',
    '',
    '| status | meaning |',
    '|---|---|',
    ...[...standard].sort(),
    '',
  ];
  if (commonParams.size) {
    out.push('## Common parameters', '', '| parameter | in | required | type | notes |', '|---|---|---|---|---|');
    for (const ref of commonParams) out.push(paramRow(doc.components.parameters[refName(ref)]));
    out.push('');
  }
  out.push('## Operations', '');
  // In the order of their tags; each section's heading is its entry in the page's outline.
  const byTag = (doc.tags as Json[]).map((tag) => operations.filter((o) => (o.op.tags ?? [])[0] === tag.name));
  for (const ops of byTag) for (const o of ops) out.push(...operationSection(doc, o, common, standard, commonParams));
  out.push('## Schemas', '');
  const seen: NotesSeen = new Map();
  for (const [name, schema] of Object.entries(doc.components.schemas as Json)) out.push(...schemaSection(name, schema as Json, seen));
  return `${out.join('\n').replace(/\n{3,}/g, '\n\n').trimEnd()}\n`;
}

// Run as a script (`npm run docs:api`): writes the page into the repository.
if (process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
  const file = join(root, API_REFERENCE);
  await writeFile(file, renderApiReference());
  process.stdout.write(`wrote ${API_REFERENCE}\n`);
}
