/**
 * The client library of the batch ingest gateway: `IngestClient` (one typed call per
 * endpoint), the retry policy, `push` (a file of one entity into a session), and
 * `describeRefusedPackage` (every error of a refused package, past the first 100 listed).
 */
export { IngestClient, API_PATH, CLIENT_VERSION, parseRetryAfter } from './client.js';
export { ApiError, ClientError, InputError, CLIENT_ERROR_CODES, describeDetail, isApiError, isClientError, type ClientErrorCode } from './errors.js';
export { isRetryable, retryDelay, withRetry, type RetryInfo, type RetryPolicy } from './retry.js';
export { Pacer } from './pacer.js';
export { push, packageKey, type PackageFailure, type PushEvent, type PushOptions, type PushSummary } from './push.js';
export { Packer, type Package } from './packer.js';
export { describeRefusedPackage, LISTED_MAX, type DescribeOptions, type RefusedPackageErrors, type RowProblem } from './refused.js';
export { formatFromPath, openSource, RESERVED_COLUMNS, SOURCE_FORMATS, type RowSource, type SourceFormat, type SourceRow } from './sources.js';
export type * from './types.js';
