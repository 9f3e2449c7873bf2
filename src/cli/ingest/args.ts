/**
 * Option values as `parseArgs` gives them, and what a command makes of them.
 */
import { UsageError } from '../../client/cli-config.js';

const MIB = 1024 * 1024;
const MAX_PACKAGE_BYTES = 32 * MIB;
export const MAX_PARALLEL = 16;
/** The service allows 30 requests/s per IP; leave room for a status poller beside the push. */
export const MAX_RATE = 30;

export function str(v: string | boolean | undefined): string | undefined {
  return typeof v === 'string' ? v : undefined;
}

export function number(v: string | boolean | undefined, name: string, fallback: number, min: number, max: number): number {
  if (v === undefined) return fallback;
  const n = typeof v === 'string' && v.trim() !== '' ? Number(v) : NaN;
  if (!Number.isFinite(n) || n < min || n > max) throw new UsageError(`--${name}: expected a number from ${min} to ${max}, got ${JSON.stringify(v)}`);
  return n;
}

export function integer(v: string | boolean | undefined, name: string, fallback: number, min: number, max: number): number {
  const n = number(v, name, fallback, min, max);
  if (!Number.isInteger(n)) throw new UsageError(`--${name}: expected a whole number from ${min} to ${max}, got ${JSON.stringify(v)}`);
  return n;
}

export function seconds(v: string | boolean | undefined, name: string, fallback: number, min = 0.001): number {
  return number(v, name, fallback, min, 7 * 24 * 3600);
}

const UNITS: Record<string, number> = { '': 1, b: 1, k: 1000, kb: 1000, kib: 1024, m: 1e6, mb: 1e6, mib: MIB };

/** `8MiB`, `512KiB`, `4MB`, `1000000` → bytes; between 1 KiB and 32 MiB. */
export function parseSize(text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text);
  const unit = m ? UNITS[m[2]!.toLowerCase()] : undefined;
  if (!m || unit === undefined) throw new UsageError(`--package-size: expected a size like 8MiB, 512KiB or 4MB, got ${JSON.stringify(text)}`);
  const bytes = Math.floor(Number(m[1]) * unit);
  if (bytes < 1024 || bytes > MAX_PACKAGE_BYTES) throw new UsageError(`--package-size: expected 1KiB to 32MiB (the service's limit), got ${JSON.stringify(text)}`);
  return bytes;
}

/** Bytes as `parseSize` reads them back: 8MiB, 512KiB, or 1500B. */
export function formatSize(bytes: number): string {
  if (bytes % MIB === 0) return `${bytes / MIB}MiB`;
  if (bytes % 1024 === 0) return `${bytes / 1024}KiB`;
  return `${bytes}B`;
}
