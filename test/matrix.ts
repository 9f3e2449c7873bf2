/**
 * The end-to-end suites run again, unchanged, on the other edge and the other back end: each
 * cell is a parameter (environment variables the suites' harness reads) and the files of
 * test/e2e/ that run under it. `npm test` (scripts/test.ts) runs the whole suite on the
 * defaults, then each cell; `.ci/node-versions` runs the e2e suites on the node edge alone.
 */
/** The flags of every `tap` run of `npm test`. */
export const TAP_FLAGS: readonly string[] = ['--disable-coverage', '--timeout=300'];

export interface MatrixCell {
  name: string;
  env: Record<string, string>;
  /** File names in test/e2e/, without `.test.ts`. */
  files: readonly string[];
}

export const MATRIX: readonly MatrixCell[] = [
  {
    name: 'the node:http edge',
    env: { TEST_HTTP_ENGINE: 'node' },
    files: [
      'cli-large',
      'cli',
      'connector',
      'counts',
      'docs-page',
      'docs',
      'errors',
      'hostile-http',
      'idempotency',
      'ingest-encoding',
      'limits',
      'observability',
      'proxy',
      'restart',
      'security',
      'transitions',
      'volume',
      'webhook',
    ],
  },
  {
    name: 'NATS JetStream + S3',
    env: { TEST_BACKEND: 'nats-s3' },
    files: ['connector', 'counts', 'errors', 'idempotency', 'restart', 'transitions', 'volume', 'webhook'],
  },
];
