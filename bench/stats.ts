/** Summaries of the clients' request samples. */
import type { RequestSamples } from './protocol.js';

/** Nearest-rank percentile of ascending `sorted`; NaN for no samples. */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1]!;
}

export interface LoadSummary {
  requests: number;
  ok: number;
  /** Status → count, for everything but 200 (0 = no HTTP answer). */
  failedByStatus: Record<string, number>;
  failures: string[];
  /** First request start to last request end, ms. */
  windowStart: number;
  windowEnd: number;
  seconds: number;
  /** Uncompressed JSON bytes of the successful requests. */
  bytes: number;
  /** Bytes sent on the wire by the successful requests (differs for gzip bodies). */
  wireBytes: number;
  rows: number;
  mbPerSec: number;
  rowsPerSec: number;
  latencyP50Ms: number;
  latencyP99Ms: number;
  latencyMaxMs: number;
  /** CPU time the load's client processes used, all together. */
  clientCpuMs: number;
}

export function summariseLoad(parts: RequestSamples[], bodyBytes: number, wireBytesPerRequest: number): LoadSummary {
  let windowStart = Infinity;
  let windowEnd = -Infinity;
  let ok = 0;
  let rows = 0;
  const failedByStatus: Record<string, number> = {};
  const failures: string[] = [];
  const latencies: number[] = [];
  let clientCpuMs = 0;
  for (const part of parts) {
    clientCpuMs += part.cpuMs;
    for (let i = 0; i < part.start.length; i++) {
      windowStart = Math.min(windowStart, part.start[i]!);
      windowEnd = Math.max(windowEnd, part.end[i]!);
      latencies.push(part.end[i]! - part.start[i]!);
      if (part.status[i] === 200) {
        ok++;
        rows += part.rows[i]!;
      } else {
        const key = String(part.status[i]);
        failedByStatus[key] = (failedByStatus[key] ?? 0) + 1;
      }
    }
    for (const f of part.failures) if (failures.length < 5 && !failures.includes(f)) failures.push(f);
  }
  latencies.sort((a, b) => a - b);
  const seconds = latencies.length ? (windowEnd - windowStart) / 1000 : Number.NaN;
  const bytes = ok * bodyBytes;
  return {
    requests: latencies.length,
    ok,
    failedByStatus,
    failures,
    windowStart,
    windowEnd,
    seconds,
    bytes,
    wireBytes: ok * wireBytesPerRequest,
    rows,
    mbPerSec: ok ? bytes / 1e6 / seconds : 0,
    rowsPerSec: ok ? rows / seconds : 0,
    latencyP50Ms: percentile(latencies, 50),
    latencyP99Ms: percentile(latencies, 99),
    clientCpuMs,
    latencyMaxMs: latencies.length ? latencies[latencies.length - 1]! : Number.NaN,
  };
}

export interface PollSummary {
  polls: number;
  failed: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
}

/** Status polls that started inside [from, to] (the load window). */
export function summarisePolls(samples: RequestSamples, from: number, to: number): PollSummary {
  const latencies: number[] = [];
  let failed = 0;
  for (let i = 0; i < samples.start.length; i++) {
    if (samples.start[i]! < from || samples.start[i]! > to) continue;
    latencies.push(samples.end[i]! - samples.start[i]!);
    if (samples.status[i] !== 200) failed++;
  }
  latencies.sort((a, b) => a - b);
  return {
    polls: latencies.length,
    failed,
    p50Ms: percentile(latencies, 50),
    p99Ms: percentile(latencies, 99),
    maxMs: latencies.length ? latencies[latencies.length - 1]! : Number.NaN,
  };
}
