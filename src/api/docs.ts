/**
 * `GET /docs`: the interactive API page. Swagger UI from the `swagger-ui-dist` package,
 * served by the service itself (nothing from a CDN) and pointed at `/openapi.json`.
 *
 * The page and its files are read once per process, when the routes are built, and kept in
 * memory: a missing package stops the service at start instead of breaking the page later.
 * `/docs/<name>` serves only the names of `DOCS_ASSETS` (a fixed allow-list, looked up as a
 * whole name, never joined to a path), so no request can reach another file.
 *
 * Caching: the page links every file as `/docs/<name>?v=<content hash>`; such a URL never
 * changes content, so it is `immutable` for a year. The page itself, and a file asked for
 * without the current hash, are `no-cache`.
 *
 * The declarations of the service's own routes (route.ts) end the file: `/openapi.json`,
 * `/docs` and `/docs/:asset`.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { errors } from '../errors.js';
import type { BufferedHandler, Reply } from '../http/server.js';
import { error, jsonResponse, NO_CACHE, q, schema, shared } from './openapi-shared.js';
import type { RouteDeclaration } from './route.js';

/** The files of `swagger-ui-dist` the page loads, by the name served under `/docs/`. */
const PACKAGE_FILES: Readonly<Record<string, string>> = {
  'swagger-ui.css': 'text/css; charset=utf-8',
  'index.css': 'text/css; charset=utf-8',
  'swagger-ui-bundle.js': 'text/javascript; charset=utf-8',
  'favicon-32x32.png': 'image/png',
  'favicon-16x16.png': 'image/png',
};

/** The page's own start-up script (a file, not inline, so the page's CSP needs no `unsafe-inline` script). */
const INIT_NAME = 'init.js';

/** Every name `/docs/<name>` serves, in the order the OpenAPI document lists them. */
export const DOCS_ASSETS: readonly string[] = [...Object.keys(PACKAGE_FILES), INIT_NAME];

/** The content type of each name of `DOCS_ASSETS`. */
export const DOCS_ASSET_TYPES: Readonly<Record<string, string>> = { ...PACKAGE_FILES, [INIT_NAME]: 'text/javascript; charset=utf-8' };

export const OPENAPI_PATH = '/openapi.json';

/**
 * `BaseLayout` without the standalone preset: no top bar that would load any URL typed into
 * it. `validatorUrl: null`: Swagger UI would otherwise send the document to
 * validator.swagger.io for its badge. Try-it-out calls go to this origin only.
 */
const INIT_SCRIPT = `'use strict';
window.addEventListener('load', function () {
  window.ui = SwaggerUIBundle({
    url: ${JSON.stringify(OPENAPI_PATH)},
    dom_id: '#swagger-ui',
    layout: 'BaseLayout',
    presets: [SwaggerUIBundle.presets.apis],
    validatorUrl: null,
    deepLinking: true,
    docExpansion: 'list',
    defaultModelsExpandDepth: 1,
    defaultModelExpandDepth: 3,
    displayOperationId: false,
    displayRequestDuration: true,
    showExtensions: false,
    tryItOutEnabled: false,
    persistAuthorization: false
  });
});
`;

/**
 * The page may load scripts, styles and images from this origin only and talk to this
 * origin only (`/openapi.json`, try-it-out). Swagger UI sets inline `style` attributes and
 * uses `data:` SVG icons, hence those two allowances.
 */
const PAGE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data:",
  "font-src 'self' data:",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

const IMMUTABLE = 'public, max-age=31536000, immutable';
const REVALIDATE = 'no-cache';

interface Asset {
  readonly contentType: string;
  readonly body: Buffer;
  /** Set when compressing pays (text files). */
  readonly gzip: Buffer | null;
  /** Short content hash: the `v` of the page's links. */
  readonly version: string;
}

interface DocsFiles {
  readonly page: Buffer;
  readonly assets: ReadonlyMap<string, Asset>;
}

let loaded: DocsFiles | undefined;

/** The directory of the installed `swagger-ui-dist` package. */
export function swaggerUiDir(): string {
  return dirname(createRequire(import.meta.url).resolve('swagger-ui-dist/package.json'));
}

function asset(contentType: string, content: Buffer): Asset {
  const text = contentType.startsWith('text/');
  // The source maps are not served: drop the comment that would make devtools ask for them.
  const body = text ? Buffer.from(content.toString('utf8').replace(/\n?(\/\/# sourceMappingURL=\S+|\/\*# sourceMappingURL=\S+ ?\*\/)\s*$/, '\n')) : content;
  return {
    contentType,
    body,
    gzip: text && body.byteLength > 1024 ? gzipSync(body, { level: 9 }) : null,
    version: createHash('sha256').update(body).digest('hex').slice(0, 16),
  };
}

function load(): DocsFiles {
  if (loaded) return loaded;
  const dir = swaggerUiDir();
  const assets = new Map<string, Asset>();
  for (const [name, type] of Object.entries(PACKAGE_FILES)) {
    let content: Buffer;
    try {
      content = readFileSync(join(dir, name));
    } catch (err) {
      throw new Error(`The docs page needs ${name} of swagger-ui-dist (looked in ${dir}); reinstall the dependencies`, { cause: err });
    }
    assets.set(name, asset(type, content));
  }
  assets.set(INIT_NAME, asset(DOCS_ASSET_TYPES[INIT_NAME]!, Buffer.from(INIT_SCRIPT)));
  const href = (name: string) => `/docs/${name}?v=${assets.get(name)!.version}`;
  const page = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Batch ingest gateway · API</title>
<link rel="stylesheet" href="${href('swagger-ui.css')}">
<link rel="stylesheet" href="${href('index.css')}">
<link rel="icon" type="image/png" href="${href('favicon-32x32.png')}" sizes="32x32">
<link rel="icon" type="image/png" href="${href('favicon-16x16.png')}" sizes="16x16">
</head>
<body>
<div id="swagger-ui"></div>
<script src="${href('swagger-ui-bundle.js')}"></script>
<script src="${href(INIT_NAME)}"></script>
</body>
</html>
`;
  loaded = { page: Buffer.from(page), assets };
  return loaded;
}

/** True when `Accept-Encoding` accepts gzip, by name or by `*` (`q=0` refuses). */
export function acceptsGzip(header: string | undefined): boolean {
  if (!header) return false;
  let gzip: number | undefined;
  let any: number | undefined;
  for (const part of header.split(',')) {
    const [coding, ...params] = part.split(';').map((s) => s.trim().toLowerCase());
    const q = params.find((p) => p.startsWith('q='));
    const weight = q === undefined ? 1 : Number(q.slice(2));
    if (coding === 'gzip' || coding === 'x-gzip') gzip = weight;
    else if (coding === '*') any = weight;
  }
  return (gzip ?? any ?? 0) > 0;
}

/**
 * The two handlers: `page` for `GET /docs`, `asset` for `GET /docs/:asset`. Reads the
 * files now (throws when `swagger-ui-dist` is missing). No authentication: the page and
 * the document describe the API, they hold no client data.
 */
export function docsHandlers(): { page: BufferedHandler; asset: BufferedHandler } {
  const files = load();
  const pageReply: Reply = {
    status: 200,
    body: files.page,
    raw: { contentType: 'text/html; charset=utf-8' },
    headers: {
      'Cache-Control': REVALIDATE,
      'Content-Security-Policy': PAGE_CSP,
      'X-Content-Type-Options': 'nosniff',
      'Referrer-Policy': 'no-referrer',
    },
  };
  return {
    page: async () => ({ ...pageReply, headers: { ...pageReply.headers } }),
    asset: async (req) => {
      const name = req.params.asset ?? '';
      const file = files.assets.get(name);
      if (!file) throw errors.routeNotFound();
      const version = new URLSearchParams(req.query).get('v');
      const headers: Record<string, string> = {
        'Cache-Control': version === file.version ? IMMUTABLE : REVALIDATE,
        'X-Content-Type-Options': 'nosniff',
      };
      let body = file.body;
      if (file.gzip) {
        headers.Vary = 'Accept-Encoding';
        if (acceptsGzip(req.headers.get('accept-encoding'))) {
          body = file.gzip;
          headers['Content-Encoding'] = 'gzip';
        }
      }
      return { status: 200, body, raw: { contentType: file.contentType }, headers };
    },
  };
}

/** What the service's own routes need: the document `/openapi.json` serves (JSON, built once the table is). */
export interface ServiceDeps {
  document: () => string;
}

export const openApiRoute: RouteDeclaration<ServiceDeps> = {
  method: 'GET',
  pattern: OPENAPI_PATH,
  body: 'buffered',
  handler: (deps) => async () => ({ status: 200, body: deps.document(), raw: { contentType: 'application/json' }, headers: { 'Cache-Control': 'no-cache' } }),
  schema: {
    operationId: 'getOpenApi',
    tags: ['service'],
    summary: 'This document',
    description: 'Not authenticated or rate-limited (the in-flight limit applies).',
    security: [],
    responses: {
      '200': { ...jsonResponse('The OpenAPI 3.1 description of the service.', schema('OpenApiDocument')), headers: { 'Cache-Control': NO_CACHE } },
      '503': shared('RateLimited'),
    },
  },
};

export const docsPageRoute: RouteDeclaration<ServiceDeps> = {
  method: 'GET',
  pattern: '/docs',
  body: 'buffered',
  handler: () => docsHandlers().page,
  schema: {
    operationId: 'getDocsPage',
    tags: ['service'],
    summary: 'Interactive API documentation',
    description:
      'Swagger UI on this document, served locally (no CDN). Not authenticated or rate-limited (the in-flight limit applies).',
    security: [],
    responses: {
      '200': {
        description: 'The page; it loads `/docs/{asset}` and `/openapi.json`.',
        headers: { 'Cache-Control': NO_CACHE },
        content: { 'text/html': { schema: { type: 'string' } } },
      },
      '503': shared('RateLimited'),
    },
  },
};

export const docsAssetRoute: RouteDeclaration<ServiceDeps> = {
  method: 'GET',
  pattern: '/docs/:asset',
  body: 'buffered',
  handler: () => docsHandlers().asset,
  schema: {
    operationId: 'getDocsAsset',
    tags: ['service'],
    summary: 'A file of the documentation page',
    description: 'Only the files the page links to; else 404.',
    security: [],
    parameters: [
      { name: 'asset', in: 'path', required: true, description: 'File name.', schema: { type: 'string', enum: [...DOCS_ASSETS] } },
      {
        name: 'v',
        in: 'query',
        required: false,
        description: 'Content version: the current one makes the file cacheable for a year.',
        schema: { type: 'string' },
      },
    ],
    responses: {
      '200': {
        description: 'The file (text files gzip when accepted).',
        headers: {
          'Cache-Control': {
            description: '`public, max-age=31536000, immutable` with the current `v`, else `no-cache`.',
            schema: { type: 'string' },
          },
        },
        content: Object.fromEntries(
          [...new Set(Object.values(DOCS_ASSET_TYPES).map((t) => t.split(';')[0]!))].map((type) => [
            type,
            { schema: type.startsWith('text/') ? { type: 'string' } : { type: 'string', contentMediaType: type } },
          ]),
        ),
      },
      '404': error([`${q('ROUTE_NOT_FOUND')}: not a file of the page`], 'ErrorDetail'),
      '503': shared('RateLimited'),
    },
  },
};
