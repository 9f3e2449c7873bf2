/**
 * The checks of a request head that do not depend on the route, the same on every adapter:
 * message framing (RFC 9112 §6.1, §6.3), the header count, `Host` (RFC 9112 §3.2), and the
 * headers a client may send once only. Whatever an adapter's parser let through is checked
 * here again, so the two edges refuse the same requests with the same answers.
 */
import { errors, type ServiceError } from '../errors.js';
import type { WireHead } from './types.js';

/**
 * Most header field lines a request may carry (431 past it). The uWS build's parser holds
 * 50 slots (request line included) and never answers a head with more; this keeps both
 * edges at the same bound, and far above what any client of the API sends (about 10).
 */
export const MAX_HEADER_FIELDS = 48;

/**
 * Sent once or refused: a second line would be a second credential or a second key, and
 * which one wins would depend on the parser (uWS answers the first, `node:http` the last).
 */
const SINGLE: readonly string[] = ['authorization', 'client-id', 'idempotency-key', 'x-connector-signature', 'x-connector-timestamp'];
const SINGLE_NAMES: Record<string, string> = {
  authorization: 'Authorization',
  'client-id': 'Client-Id',
  'idempotency-key': 'Idempotency-Key',
  'x-connector-signature': 'X-Connector-Signature',
  'x-connector-timestamp': 'X-Connector-Timestamp',
};

export interface CheckedHead {
  /** One value per name; several lines of one header joined with `, ` (RFC 9110 §5.3). */
  headers: Map<string, string>;
  /** The declared body length; null when none is declared (chunked, or no body). */
  contentLength: number | null;
  /** A body follows the head (a non-zero `Content-Length`, or chunked). */
  hasBody: boolean;
  /** The first failed check; the request is answered with it and the connection closed. */
  problem: ServiceError | null;
}

export function checkHead(head: WireHead): CheckedHead {
  const headers = new Map<string, string>();
  const counts = new Map<string, number>();
  for (const [name, value] of head.fields) {
    const seen = headers.get(name);
    headers.set(name, seen === undefined ? value : `${seen}, ${value}`);
    counts.set(name, (counts.get(name) ?? 0) + 1);
  }
  const declared = headers.get('content-length');
  const chunked = headers.has('transfer-encoding');
  const contentLength = declared !== undefined && /^\d+$/.test(declared) ? Number(declared) : null;
  const hasBody = chunked || (contentLength ?? 0) > 0;
  const result = (problem: ServiceError | null): CheckedHead => ({ headers, contentLength, hasBody, problem });

  if (head.httpVersion !== '1.1' && head.httpVersion !== '1.0') return result(errors.httpVersionNotSupported());
  if (head.fields.length > MAX_HEADER_FIELDS) return result(errors.headersTooLarge());
  // Framing, RFC 9112 §6.3: a body whose length is not one plain number, or that is both
  // chunked and of a declared length, could be read two ways; any such request is refused.
  if (declared !== undefined && (counts.get('content-length')! > 1 || contentLength === null)) return result(errors.invalidContentLength());
  if (chunked) {
    if (declared !== undefined) return result(errors.conflictingFraming());
    // Only `chunked` alone is understood (§6.1); an HTTP/1.0 message must not be chunked at all.
    const coding = headers.get('transfer-encoding')!.toLowerCase();
    if (counts.get('transfer-encoding')! > 1 || coding !== 'chunked' || head.httpVersion === '1.0') return result(errors.invalidTransferEncoding());
  }
  const hosts = counts.get('host') ?? 0;
  if (hosts > 1 || (hosts === 0 && head.httpVersion === '1.1')) return result(errors.invalidHost());
  for (const name of SINGLE) if ((counts.get(name) ?? 0) > 1) return result(errors.duplicateHeader(SINGLE_NAMES[name]!));
  return result(null);
}
