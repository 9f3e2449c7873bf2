import t from 'tap';
import { openApiDocument } from '../../src/api/openapi.js';
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

t.test('every route of the router is documented, and nothing else', async (t) => {
  const table = routes({} as any).map((r) => `${r.method.toLowerCase()} ${r.pattern.replace(/:(\w+)/g, '{$1}')}`);
  t.ok(table.length >= 9);
  t.same(operations.map((o) => `${o.method} ${o.path}`).sort(), [...table].sort());
});

t.test('every $ref resolves', async (t) => {
  const all = refs(doc);
  t.ok(all.length > 0);
  for (const ref of new Set(all)) t.ok(resolve(ref), ref);
});

t.test('every response has a description and a JSON body that references a component schema', async (t) => {
  for (const { path, method, op } of operations) {
    t.ok(op.operationId, `${method} ${path} operationId`);
    t.ok(Object.keys(op.responses).includes('200'), `${method} ${path} 200`);
    for (const [status, raw] of Object.entries(op.responses as Json)) {
      const response = deref(raw);
      const where = `${method} ${path} ${status}`;
      t.type(response.description, 'string', where);
      const schema = response.content?.['application/json']?.schema;
      t.ok(schema, `${where} has a JSON schema`);
      const names = refs(schema).map((r) => r.replace('#/components/schemas/', ''));
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

  for (const path of ['/{upload_uuid}/delete', '/{upload_uuid}/{entity_name}']) {
    t.same(schemaOf('post', path, '409'), { $ref: '#/components/schemas/InvalidSessionStatusError' }, path);
  }
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

  t.same(schemaOf('post', '/{upload_uuid}/{entity_name}', '422'), { $ref: '#/components/schemas/IngestPayloadError' });
  t.same(schemas.IngestPayloadError.properties.detail, { type: 'string' });
});

t.test('request bodies', async (t) => {
  const body = (method: string, path: string): Json => op(method, path).requestBody.content['application/json'].schema;
  t.same(body('post', '/{upload_uuid}/{entity_name}'), { $ref: '#/components/schemas/IngestRequest' });
  t.same(schemas.IngestRequest.required, ['columns', 'data']);
  t.same(body('post', '/{upload_uuid}/start-upload'), { $ref: '#/components/schemas/StartUploadRequest' });
  for (const field of ['date_from', 'date_to']) {
    t.equal(resolve(schemas.StartUploadRequest.properties[field].$ref)!.format, 'date', field);
  }
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
});

t.test('status and the error statuses the spec names', async (t) => {
  t.same(schemaOf('get', '/{upload_uuid}/status', '200'), { $ref: '#/components/schemas/StatusView' });
  t.same(schemas.StatusView.required, [
    'upload_uuid',
    'session_status',
    'entities',
    'upload_tasks_finished',
    'can_upload_entities',
    'can_start_upload',
    'can_terminate',
  ]);
  const has = (method: string, path: string, statuses: string[]) =>
    t.same(statuses.filter((s) => !(s in op(method, path).responses)), [], `${method} ${path}`);
  has('post', '/{upload_uuid}/{entity_name}', ['400', '401', '403', '409', '413', '422', '503']);
  has('post', '/{upload_uuid}/start-upload', ['400', '401', '403', '409', '422', '500', '502']);
  has('post', '/{upload_uuid}/terminate', ['404', '409', '500', '502']);
  has('get', '/{upload_uuid}/status', ['401', '404']);
  t.ok(deref(op('post', '/initialize-session').responses['503']).headers['Retry-After']);
});

t.test('callers get their own copy', async (t) => {
  (openApiDocument() as Json).info.version = 'changed';
  t.equal((openApiDocument() as Json).info.version, '0.1.0');
});
