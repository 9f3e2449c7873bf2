import t from 'tap';
import { acceptsGzip, DOCS_ASSET_TYPES, DOCS_ASSETS } from '../../src/api/docs.js';

t.test('acceptsGzip: by name or by *, q=0 refuses', async (t) => {
  const cases: [string | undefined, boolean][] = [
    [undefined, false],
    ['', false],
    ['identity', false],
    ['gzip', true],
    ['GZIP', true],
    ['x-gzip', true],
    ['gzip, deflate, br, zstd', true],
    ['br;q=1.0, gzip;q=0.8, *;q=0.1', true],
    ['gzip;q=0', false],
    ['gzip; q=0.0', false],
    ['*', true],
    ['*;q=0', false],
    ['gzip;q=0, *', false],
    ['*;q=0, gzip', true],
    ['deflate, br', false],
    ['gzip;q=abc', false],
  ];
  for (const [header, expected] of cases) t.equal(acceptsGzip(header), expected, String(header));
});

t.test('the allow-list: every name has a content type, no path separators', async (t) => {
  t.same(Object.keys(DOCS_ASSET_TYPES).sort(), [...DOCS_ASSETS].sort());
  for (const name of DOCS_ASSETS) t.match(name, /^[\w-]+(\.[\w-]+)+$/, name);
});
