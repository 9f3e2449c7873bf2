import { createHmac, timingSafeEqual } from 'node:crypto';
import { request } from 'undici';
import type { ValidationIssue } from '../errors.js';
import type { WebhookPayload } from './types.js';

/**
 * The completion webhook's signature (docs/api.md, "The completion webhook"):
 * `X-Connector-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + raw body)>`,
 * `X-Connector-Timestamp: <unix seconds>`. The same scheme as Stripe's and Slack's: the
 * timestamp is signed with the body so a captured request cannot be replayed later.
 */
export const TIMESTAMP_HEADER = 'x-connector-timestamp';
export const SIGNATURE_HEADER = 'x-connector-signature';
export const DEFAULT_TOLERANCE_SECONDS = 300;

const SIGNATURE_RE = /^sha256=([0-9a-fA-F]{64})$/;
const TIMESTAMP_RE = /^[0-9]{1,15}$/;

function hmac(secret: string, timestamp: string, rawBody: Uint8Array | string): Buffer {
  return createHmac('sha256', secret).update(`${timestamp}.`).update(rawBody).digest();
}

export function signWebhook(secret: string, timestampSeconds: number, rawBody: Uint8Array | string): string {
  return `sha256=${hmac(secret, String(timestampSeconds), rawBody).toString('hex')}`;
}

export interface VerifyWebhookInput {
  secret: string;
  timestampHeader: string | null | undefined;
  signatureHeader: string | null | undefined;
  /** The body bytes exactly as received, before any parsing. */
  rawBody: Uint8Array | string;
  /** Defaults to the current time. */
  nowSeconds?: number;
  toleranceSeconds?: number;
}

/**
 * True only for a well-formed signature of this body and timestamp under `secret`, with the
 * timestamp (an unsigned integer string, signed as received) at most `toleranceSeconds`
 * from now either way. Never throws; an empty secret verifies nothing. Constant time in
 * the signature's value.
 */
export function verifyWebhook(input: VerifyWebhookInput): boolean {
  const { secret, timestampHeader, signatureHeader, rawBody } = input;
  if (!secret || typeof timestampHeader !== 'string' || typeof signatureHeader !== 'string') return false;
  if (!TIMESTAMP_RE.test(timestampHeader)) return false;
  const now = input.nowSeconds ?? Math.floor(Date.now() / 1000);
  if (Math.abs(now - Number(timestampHeader)) > (input.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS)) return false;
  const hex = SIGNATURE_RE.exec(signatureHeader)?.[1];
  if (hex === undefined) return false;
  return timingSafeEqual(Buffer.from(hex, 'hex'), hmac(secret, timestampHeader, rawBody));
}

/**
 * Until when (ms since the epoch) a webhook signed at `timestampHeader` must be remembered as
 * applied, so that a replay of it is told apart: `verifyWebhook` compares whole seconds, so it
 * accepts the request until a second past `toleranceSeconds`; and another gateway whose clock
 * is behind accepts it later still, by up to its lag. Kept twice the window and a second,
 * a replay verifies nowhere after that on clocks within `toleranceSeconds` of each other.
 */
export function replayRememberedUntilMs(timestampHeader: string, toleranceSeconds: number = DEFAULT_TOLERANCE_SECONDS): number {
  return (Number(timestampHeader) + 2 * toleranceSeconds + 1) * 1000;
}

export type ParsedWebhook = { ok: true; value: WebhookPayload } | { ok: false; issues: ValidationIssue[] };

const STATUSES = ['succeeded', 'failed', 'terminated'] as const;
const STATUS_EXPECTED = "'succeeded', 'failed' or 'terminated'";
const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * Validates the webhook body the way FastAPI + Pydantic v2 would for the model
 * `{upload_uuid: str, is_terminated: bool, status: Literal[...] | None, message: str | None}`,
 * except that `is_terminated` is strict (no `"true"`/`1` coercion). Unknown fields are
 * ignored; `null` for an optional field means absent. Issues use the 422 array's shape.
 */
export function parseWebhookPayload(raw: Uint8Array): ParsedWebhook {
  if (raw.byteLength === 0) return fail({ type: 'missing', loc: ['body'], msg: 'Field required', input: null });
  let body: unknown;
  try {
    body = JSON.parse(strictUtf8.decode(raw));
  } catch (err) {
    return fail({
      type: 'json_invalid',
      loc: ['body', 0],
      msg: 'JSON decode error',
      input: {},
      ctx: { error: err instanceof Error ? err.message : String(err) },
    });
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    return fail({
      type: 'model_attributes_type',
      loc: ['body'],
      msg: 'Input should be a valid dictionary or object to extract fields from',
      input: body,
    });
  }
  const obj = body as Record<string, unknown>;
  const issues: ValidationIssue[] = [];
  const at = (field: string): (string | number)[] => ['body', field];

  // Field by field in model order, as Pydantic reports them.
  if (!('upload_uuid' in obj)) issues.push({ type: 'missing', loc: at('upload_uuid'), msg: 'Field required', input: obj });
  else if (typeof obj.upload_uuid !== 'string') {
    issues.push({ type: 'string_type', loc: at('upload_uuid'), msg: 'Input should be a valid string', input: obj.upload_uuid });
  }
  if (!('is_terminated' in obj)) issues.push({ type: 'missing', loc: at('is_terminated'), msg: 'Field required', input: obj });
  else if (typeof obj.is_terminated !== 'boolean') {
    issues.push({ type: 'bool_type', loc: at('is_terminated'), msg: 'Input should be a valid boolean', input: obj.is_terminated });
  }
  const { status, message } = obj;
  if (status != null && !(STATUSES as readonly unknown[]).includes(status)) {
    issues.push({
      type: 'literal_error',
      loc: at('status'),
      msg: `Input should be ${STATUS_EXPECTED}`,
      input: status,
      ctx: { expected: STATUS_EXPECTED },
    });
  }
  if (message != null && typeof message !== 'string') {
    issues.push({ type: 'string_type', loc: at('message'), msg: 'Input should be a valid string', input: message });
  }
  if (issues.length > 0) return { ok: false, issues };

  const value: WebhookPayload = { upload_uuid: obj.upload_uuid as string, is_terminated: obj.is_terminated as boolean };
  if (status != null) value.status = status as WebhookPayload['status'];
  if (message != null) value.message = message as string;
  return { ok: true, value };
}

function fail(issue: ValidationIssue): ParsedWebhook {
  return { ok: false, issues: [issue] };
}

export interface SendWebhookInput {
  url: string;
  secret: string;
  /** `workflow_id`: the emulator's, which the gateway ignores (as any unknown field). */
  payload: WebhookPayload & { workflow_id?: string };
  /** Deadline of the whole exchange. */
  timeoutMs: number;
  signal?: AbortSignal;
}

/**
 * Posts `payload` to `url`, signed with the current time. Resolves with the HTTP status
 * (whatever it is); rejects with the transport error (undici's) when there is no answer.
 */
export async function sendWebhook(input: SendWebhookInput): Promise<number> {
  const body = JSON.stringify(input.payload);
  const timestamp = Math.floor(Date.now() / 1000);
  const res = await request(input.url, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      [TIMESTAMP_HEADER]: String(timestamp),
      [SIGNATURE_HEADER]: signWebhook(input.secret, timestamp, body),
    },
    body,
    headersTimeout: input.timeoutMs,
    bodyTimeout: input.timeoutMs,
    signal: input.signal ? AbortSignal.any([input.signal, AbortSignal.timeout(input.timeoutMs)]) : AbortSignal.timeout(input.timeoutMs),
  });
  await res.body.dump();
  return res.statusCode;
}
