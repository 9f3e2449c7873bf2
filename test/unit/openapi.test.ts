import { Validator } from '@seriousme/openapi-schema-validator';
import t from 'tap';
import { DOCS_ASSETS } from '../../src/api/docs.js';
import { healthRoutes } from '../../src/api/health.js';
import { metricsRoute } from '../../src/api/metrics.js';
import { openApiDocument } from '../../src/api/openapi.js';
import { openApiPath } from '../../src/api/route.js';
import { DOCUMENTED_ROUTES, OPERATOR_ROUTES } from '../../src/api/route-list.js';
import { routes } from '../../src/api/routes.js';
import { ENTITIES } from '../../src/entities/catalog.js';

type Json = Record<string, any>;
const doc = openApiDocument() as Json;
const schemas: Json = doc.components.schemas;

/** Every `$ref` anywhere below `node`. */
function refs(node: unknown, out: string[] = []): string[] {
  if (Array.isArray(node)) for (const v of node) refs(v, out);
  else if (node !== null && typeof node === 'object') {
    for (const [k, v] of Object.entries(node)) {
      if (k === '$ref' && typeof v === 'string') out.push(v);
      else refs(v, out);
    }
  }
  return out;
}

function resolve(ref: string): Json | undefined {
  const [hash, ...parts] = ref.split('/');
  return hash === '#' ? parts.reduce<any>((node, key) => node?.[key], doc) : undefined;
}

/** A response with `$ref`s to components.responses followed. */
const deref = (response: Json): Json => (response.$ref ? resolve(response.$ref)! : response);

const operations = Object.entries(doc.paths as Json).flatMap(([path, item]) =>
  Object.entries(item as Json).map(([method, op]) => ({ path, method, op: op as Json })),
);

t.test('document header', async (t) => {
  t.equal(doc.openapi, '3.1.0');
  t.equal(doc.info.version, '0.1.0');
  t.equal(doc.info.title, 'Batch Upload and Connector Processing Service');
  t.match(doc.components.securitySchemes.Authorization, { type: 'apiKey', in: 'header', name: 'Authorization' });
  t.match(doc.components.securitySchemes['Client-Id'], { type: 'apiKey', in: 'header', name: 'Client-Id' });
  t.same(doc.security, [{ Authorization: [], 'Client-Id': [] }]);
});

t.test('a valid OpenAPI 3.1 document (@seriousme/openapi-schema-validator)', async (t) => {
  const validator = new Validator();
  const result = await validator.validate(openApiDocument() as Json);
  t.equal(validator.version, '3.1');
  t.ok(result.valid, 'valid');
  t.same(result.errors ?? [], [], 'no errors');

  // The validator does check: a broken copy fails.
  const broken = openApiDocument() as Json;
  broken.paths['/openapi.json'].get.responses['200'].content['application/json'].unknown = true;
  t.notOk((await new Validator().validate(broken)).valid, 'an unknown field is refused');
});

t.test('every schema keyword `type` names a JSON Schema type', async (t) => {
  // The OpenAPI 3.1 meta-schema leaves Schema Objects to the JSON Schema dialect; check the obvious.
  const TYPES = new Set(['null', 'boolean', 'object', 'array', 'number', 'integer', 'string']);
  const walk = (node: unknown, where: string): void => {
    if (Array.isArray(node)) node.forEach((v, i) => walk(v, `${where}/${i}`));
    else if (node !== null && typeof node === 'object') {
      for (const [k, v] of Object.entries(node)) {
        if (k === 'type' && (typeof v === 'string' || Array.isArray(v)) && where.includes('schema')) {
          for (const type of [v].flat()) t.ok(TYPES.has(type as string), `${where}: ${String(type)}`);
        }
        walk(v, `${where}/${k}`);
      }
    }
  };
  walk(doc.components.schemas, 'schemas');
  walk(doc.paths, 'paths');
});

/** The router's whole table as app.ts builds it (handlers are never called here). */
const operatorRoutes = (withMetrics: boolean) => [...healthRoutes({} as any, 'node'), ...(withMetrics ? [metricsRoute({} as any, null)] : [])];
const routeKeys = (table: { method: string; pattern: string }[]) => table.map((r) => `${r.method.toLowerCase()} ${openApiPath(r.pattern)}`);

t.test('every route of the router is documented, and nothing else', async (t) => {
  const served = routes({} as any, operatorRoutes(true));
  const table = routeKeys(served);
  t.ok(table.length >= 14);
  for (const path of ['/metrics', '/healthz', '/readyz', '/docs', '/docs/{asset}', '/openapi.json']) {
    t.ok(table.includes(`get ${path}`), `${path} is routed`);
  }
  const documented = operations.map((o) => `${o.method} ${o.path}`);
  t.same(
    table.filter((r) => !documented.includes(r)),
    [],
    'routed (src/api/routes.ts, or app.ts operator routes) but without an operation in the document',
  );
  t.same(
    documented.filter((d) => !table.includes(d)),
    [],
    'documented (src/api/openapi.ts) but not routed',
  );
  t.equal(new Set(documented).size, documented.length, 'each operation once');
  const ids = operations.map((o) => o.op.operationId);
  t.equal(new Set(ids).size, ids.length, 'operationIds are unique');
  t.same(openApiDocument(served), doc, 'the document of the whole table is the whole document');
});

t.test('one declaration per route: the table and the document are made from the same declarations', async (t) => {
  const key = (r: { method: string; pattern: string }) => `${r.method.toLowerCase()} ${openApiPath(r.pattern)}`;
  const declared = DOCUMENTED_ROUTES.map(key);
  t.equal(new Set(declared).size, declared.length, 'each route declared once');
  const table = routes({} as any, operatorRoutes(true));
  t.same([...routeKeys(table)].sort(), [...declared].sort(), 'the whole table is the declared routes');
  t.same(
    operatorRoutes(true).map((r) => `${r.method} ${r.pattern} ${r.body}`),
    OPERATOR_ROUTES.map((r) => `${r.method} ${r.pattern} ${r.body}`),
    'the operator routes app.ts adds are the declared ones',
  );
  for (const route of DOCUMENTED_ROUTES) {
    t.same(doc.paths[openApiPath(route.pattern)]?.[route.method.toLowerCase()], route.schema, `${key(route)}: its operation is its declared schema`);
    const routed = table.find((r) => key(r) === key(route));
    t.equal(routed?.body, route.body, `${key(route)}: routed with its declared body kind`);
    t.equal(typeof routed?.handler, 'function', `${key(route)}: routed with a handler`);
  }
  t.same(
    table.filter((r) => r.body === 'streaming').map(key),
    ['post /api/v1/uploading/{upload_uuid}/{entity_name}'],
    'only ingest streams its body',
  );
});

t.test('the served document describes what is routed: no /metrics while metrics are disabled', async (t) => {
  const table = routes({} as any, operatorRoutes(false));
  const served = openApiDocument(table) as Json;
  const documented = Object.entries(served.paths as Json).flatMap(([path, item]) => Object.keys(item as Json).map((m) => `${m} ${path}`));
  t.same(documented.sort(), routeKeys(table).sort());
  t.notOk(served.paths['/metrics']);
  t.ok(served.paths['/readyz']);
  t.same(
    served.tags.map((tag: Json) => tag.name),
    ['uploading', 'connector', 'service', 'operations'],
  );
  const bare = openApiDocument(routes({} as any)) as Json;
  t.notOk(bare.paths['/healthz']);
  t.same(bare.tags.map((tag: Json) => tag.name), ['uploading', 'connector', 'service'], 'unused tags are dropped');
  t.ok((await new Validator().validate(bare)).valid, 'still a valid document');
});

t.test('every $ref resolves', async (t) => {
  const all = refs(doc);
  t.ok(all.length > 0);
  for (const ref of new Set(all)) t.ok(resolve(ref), ref);
});

t.test('every response has a description and a body schema; JSON bodies reference a component schema', async (t) => {
  for (const { path, method, op } of operations) {
    t.ok(op.operationId, `${method} ${path} operationId`);
    t.ok(op.summary, `${method} ${path} summary`);
    t.ok(Object.keys(op.responses).includes('200'), `${method} ${path} 200`);
    t.ok(op.responses['503'], `${method} ${path} 503: every path counts against the in-flight limit`);
    for (const [status, raw] of Object.entries(op.responses as Json)) {
      const response = deref(raw);
      const where = `${method} ${path} ${status}`;
      t.type(response.description, 'string', where);
      const content = Object.entries((response.content ?? {}) as Json);
      t.ok(content.length > 0, `${where} has a body`);
      for (const [type, media] of content) t.ok(media.schema, `${where} ${type} has a schema`);
      const jsonBody = response.content?.['application/json'];
      if (!jsonBody) {
        t.ok(['/docs', '/docs/{asset}', '/metrics'].includes(path), `${where}: only the docs page and metrics answer other than JSON`);
        continue;
      }
      const names = refs(jsonBody.schema).map((r) => r.replace('#/components/schemas/', ''));
      t.ok(names.length > 0, `${where} references a component`);
      for (const name of names) t.ok(schemas[name], `${where} → ${name}`);
    }
    for (const p of op.parameters ?? []) {
      const param = p.$ref ? resolve(p.$ref) : p;
      t.ok(param?.name && param.in && param.schema, `${method} ${path} parameter`);
      if (param?.in === 'path') t.ok(path.includes(`{${param.name}}`), `${path} has {${param.name}}`);
    }
  }
});

const op = (method: string, path: string): Json => doc.paths[`/api/v1/uploading${path}`][method];
const schemaOf = (method: string, path: string, status: string): Json =>
  deref(op(method, path).responses[status]).content['application/json'].schema;

t.test('the three 409 shapes', async (t) => {
  t.same(schemaOf('post', '/initialize-session', '409'), { $ref: '#/components/schemas/InitializeSessionConflict' });
  t.same(schemas.InitializeSessionConflict.required.sort(), ['message', 'session_status', 'status', 'upload_uuid']);
  t.notOk(schemas.InitializeSessionConflict.properties.detail, 'flat, no detail wrapper');

  t.same(schemaOf('post', '/{upload_uuid}/delete', '409'), { $ref: '#/components/schemas/InvalidSessionStatusError' });
  // Ingest: the structured shape for the session state; a string detail for an Idempotency-Key still in progress.
  t.same(refs(schemaOf('post', '/{upload_uuid}/{entity_name}', '409')).sort(), [
    '#/components/schemas/ErrorDetail',
    '#/components/schemas/InvalidSessionStatusError',
  ]);
  t.match(
    deref(op('post', '/{upload_uuid}/{entity_name}').responses['409']).description,
    'Upload session is full: it holds 10000000 packages',
    'ingest: a full session is one of its 409s',
  );
  const detail = resolve(schemas.InvalidSessionStatusError.properties.detail.$ref)!;
  t.same(detail.required, ['message', 'expected', 'actual']);
  t.equal(detail.properties.message.default, 'Invalid upload session status');

  const start = schemaOf('post', '/{upload_uuid}/start-upload', '409');
  t.same(refs(start).sort(), [
    '#/components/schemas/ErrorDetail',
    '#/components/schemas/InvalidSessionStatusError',
    '#/components/schemas/UploadTasksInProgressError',
  ]);
  t.equal(schemas.UploadTasksInProgressError.properties.detail.const, 'Upload tasks are still in progress');
  t.same(schemas.ErrorDetail.properties.detail, { type: 'string' });
});

t.test('both 422 shapes', async (t) => {
  t.same(schemaOf('post', '/{upload_uuid}/start-upload', '422'), { $ref: '#/components/schemas/ValidationError' });
  t.same(schemaOf('post', '/webhooks/upload-finished', '422'), { $ref: '#/components/schemas/ValidationError' });
  t.equal(schemas.ValidationError.properties.detail.type, 'array');
  const issue = resolve(schemas.ValidationError.properties.detail.items.$ref)!;
  t.same(Object.keys(issue.properties).sort(), ['ctx', 'input', 'loc', 'msg', 'type']);
  t.same(issue.required.sort(), ['loc', 'msg', 'type']);

  // Ingest: a string detail for the payload checks, the validation array for a body of the wrong structure.
  t.same(schemaOf('post', '/{upload_uuid}/{entity_name}', '422'), {
    anyOf: [{ $ref: '#/components/schemas/IngestPayloadError' }, { $ref: '#/components/schemas/ValidationError' }],
  });
  t.same(schemas.IngestPayloadError.properties.detail, { type: 'string' });
  t.same(schemas.IngestPayloadError.required, ['detail'], 'errors and error_count come with refused rows only');
  t.match(schemas.IngestPayloadError.properties.errors, { type: 'array', maxItems: 100, items: { $ref: '#/components/schemas/RefusedRow' } });
  t.match(schemas.IngestPayloadError.properties.error_count, { type: 'integer', minimum: 1 });
  t.same(schemas.RefusedRow.required.sort(), ['column', 'message', 'row']);
  const messages = deref(op('post', '/{upload_uuid}/{entity_name}').responses['422']).description;
  for (const message of [
    'Invalid JSON format.',
    'The columns array cannot be empty.',
    'Duplicate column: <column>',
    'Unknown column: <column>',
    'Missing required columns: <column list>',
    'Duplicate key in payload: <key>',
    'Invalid data types in payload: <detail>',
  ]) {
    t.match(messages, `\`${message}\``, message);
  }
});

t.test('ingest headers: Content-Encoding (415 otherwise) and Idempotency-Key', async (t) => {
  const ingest = op('post', '/{upload_uuid}/{entity_name}');
  const params = ingest.parameters.map((p: Json) => (p.$ref ? resolve(p.$ref)! : p));
  const header = (name: string) => params.find((p: Json) => p.in === 'header' && p.name === name);
  t.match(header('Content-Encoding'), { required: false, schema: { enum: ['identity', 'gzip', 'x-gzip'] } });
  t.match(header('Idempotency-Key'), { required: false, schema: { type: 'string' } });
  t.match(deref(ingest.responses['415']).description, '`Unsupported Media Type`');
  t.same(schemaOf('post', '/{upload_uuid}/{entity_name}', '415'), { $ref: '#/components/schemas/ErrorDetail' });
  t.match(deref(ingest.responses['413']).description, 'inflated');
  for (const status of ['200', '413', '422']) {
    t.match(deref(ingest.responses[status]).headers?.['Idempotent-Replayed'], { required: false, schema: { const: 'true' } }, status);
  }
  t.match(deref(ingest.responses['409']).headers?.['Retry-After'], { required: false, schema: { type: 'integer', minimum: 1 } });
});

t.test('503 carries Retry-After on every operation', async (t) => {
  for (const { path, method, op: operation } of operations) {
    const retryAfter = deref(operation.responses['503']).headers?.['Retry-After'];
    // /readyz: its own 503 (not ready) has none; the in-flight limit's 503 has it.
    t.match(retryAfter, { required: path !== '/readyz', schema: { type: 'integer', minimum: 1 } }, `${method} ${path}`);
  }
});

t.test('the docs page and its files', async (t) => {
  const page = doc.paths['/docs'].get;
  t.same(page.security, []);
  t.ok(page.responses['200'].content['text/html']);
  const asset = doc.paths['/docs/{asset}'].get;
  t.same(asset.security, []);
  t.same(asset.parameters.find((p: Json) => p.in === 'path').schema.enum, [...DOCS_ASSETS]);
  t.same(Object.keys(asset.responses['200'].content).sort(), ['image/png', 'text/css', 'text/javascript']);
  t.same(deref(asset.responses['404']).content['application/json'].schema, { $ref: '#/components/schemas/ErrorDetail' });
});

t.test('request bodies', async (t) => {
  const body = (method: string, path: string): Json => op(method, path).requestBody.content['application/json'].schema;
  t.same(body('post', '/{upload_uuid}/{entity_name}'), { $ref: '#/components/schemas/IngestRequest' });
  t.same(schemas.IngestRequest.required, ['columns', 'data']);
  t.same(body('post', '/{upload_uuid}/start-upload'), { $ref: '#/components/schemas/StartUploadRequest' });
  for (const field of ['date_from', 'date_to']) {
    t.match(schemas.StartUploadRequest.properties[field], { type: 'string', format: 'date' }, field);
  }
  t.same(schemas.StartUploadRequest.required, ['date_from', 'date_to']);
  const columns = schemas.IngestRequest.properties.columns;
  t.match(columns, { type: 'array', items: { type: 'string' }, minItems: 1 });
  t.equal(schemas.IngestRequest.properties.data.type, 'array');
  t.equal(schemas.IngestRequest.properties.data.items.type, 'array');
  t.same(body('post', '/webhooks/upload-finished'), { $ref: '#/components/schemas/UploadFinishedPayload' });
});

t.test('ingest lists the catalog; the webhook is signed, not client-authenticated', async (t) => {
  const ingest = op('post', '/{upload_uuid}/{entity_name}');
  for (const e of ENTITIES) t.match(ingest.description, `\`${e.name}\``);
  t.same(doc.components.parameters.EntityName.schema.enum, ENTITIES.map((e) => e.name));

  const webhook = op('post', '/webhooks/upload-finished');
  t.same(webhook.security, []);
  const headers = webhook.parameters.map((p: Json) => resolve(p.$ref)!.name);
  t.same(headers, ['X-Connector-Timestamp', 'X-Connector-Signature']);
  t.same(doc.paths['/openapi.json'].get.security, []);
  for (const { path, method, op: operation } of operations) {
    if (path.startsWith('/api/v1/') || path === '/metrics') continue;
    t.same(operation.security, [], `${method} ${path} is not authenticated`);
  }
  t.same(doc.paths['/metrics'].get.security, [{}, { MetricsToken: [] }], '/metrics: a bearer token only when configured');
});

t.test('status and the error statuses docs/api.md names', async (t) => {
  t.same(schemaOf('get', '/{upload_uuid}/status', '200'), { $ref: '#/components/schemas/StatusView' });
  t.same(schemas.StatusView.required, [
    'upload_uuid',
    'session_status',
    'entities',
    'upload_tasks_finished',
    'can_upload_entities',
    'can_start_upload',
    'can_terminate',
    'entity_counts',
    'totals',
  ]);
  t.same(schemas.SessionList.required, ['sessions', 'next_cursor']);
  const has = (method: string, path: string, statuses: string[]) =>
    t.same(statuses.filter((s) => !(s in op(method, path).responses)), [], `${method} ${path}`);
  has('post', '/{upload_uuid}/{entity_name}', ['400', '401', '403', '409', '413', '422', '503']);
  has('post', '/{upload_uuid}/start-upload', ['400', '401', '403', '409', '422', '500', '502']);
  has('get', '/sessions', ['400', '401', '403', '422', '503']);
  has('post', '/{upload_uuid}/terminate', ['404', '409', '500', '502']);
  has('get', '/{upload_uuid}/status', ['401', '404']);
  t.ok(deref(op('post', '/initialize-session').responses['503']).headers['Retry-After']);
});

t.test('callers get their own copy', async (t) => {
  (openApiDocument() as Json).info.version = 'changed';
  t.equal((openApiDocument() as Json).info.version, '0.1.0');
});
