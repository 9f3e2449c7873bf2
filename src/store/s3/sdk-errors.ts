/**
 * What an S3 SDK error says: its name, HTTP status, whether it means a missing key, and a line to log.
 */

export function errorName(err: unknown): string | undefined {
  return typeof err === 'object' && err !== null ? (err as { name?: string }).name : undefined;
}

export function statusOf(err: unknown): number | undefined {
  return typeof err === 'object' && err !== null
    ? (err as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode
    : undefined;
}

/** NoSuchKey, or a bare 404 from servers that send no error body; a missing bucket stays an error. */
export function isMissingKey(err: unknown): boolean {
  const name = errorName(err);
  return name === 'NoSuchKey' || (statusOf(err) === 404 && name !== 'NoSuchBucket');
}

export function describe(err: unknown): string {
  const status = statusOf(err);
  const name = errorName(err) ?? 'Error';
  const message = err instanceof Error ? err.message : String(err);
  return `${name}${status ? ` (HTTP ${status})` : ''}: ${message}`;
}
