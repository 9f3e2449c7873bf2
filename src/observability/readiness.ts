/**
 * Readiness: every check runs in parallel, each cut at one deadline. Concurrent probes share
 * one run, so a burst of probes costs one round of requests. A check that changes state is
 * logged once (with its error when it fails), not once per probe.
 */
import type { Logger } from '../log.js';

/** Resolves when the system behind it answers within `timeoutMs`. */
export type Check = (timeoutMs: number) => Promise<void>;

export type CheckResult = 'ok' | 'failed' | 'timeout';

export interface ReadinessReport {
  ready: boolean;
  checks: Record<string, CheckResult>;
}

/** `GET /healthz` 200, on the gateway and the uploader alike. */
export const HEALTHY_BODY = { status: 'ok' } as const;

/** `GET /readyz` 200: `{status: "ready", checks, ...extra}` (the 503 is `errors.notReady`, errors.ts). */
export function readyBody<T extends object>(checks: ReadinessReport['checks'], extra: T = {} as T): { status: 'ready'; checks: ReadinessReport['checks'] } & T {
  return { status: 'ready', checks, ...extra };
}

export class Readiness {
  readonly #checks: ReadonlyMap<string, Check>;
  readonly #timeoutMs: number;
  readonly #log: Logger;
  readonly #last = new Map<string, CheckResult>();
  #running: Promise<ReadinessReport> | null = null;

  constructor(checks: Record<string, Check>, timeoutMs: number, log: Logger) {
    this.#checks = new Map(Object.entries(checks));
    this.#timeoutMs = timeoutMs;
    this.#log = log;
  }

  run(): Promise<ReadinessReport> {
    return (this.#running ??= this.#run().finally(() => {
      this.#running = null;
    }));
  }

  async #run(): Promise<ReadinessReport> {
    const names = [...this.#checks.keys()];
    const results = await Promise.all(names.map((name) => this.#one(name, this.#checks.get(name)!)));
    const checks: Record<string, CheckResult> = {};
    names.forEach((name, i) => (checks[name] = results[i]!));
    return { ready: results.every((r) => r === 'ok'), checks };
  }

  async #one(name: string, check: Check): Promise<CheckResult> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), this.#timeoutMs)));
    let error: unknown;
    const result = await Promise.race([
      check(this.#timeoutMs).then(
        () => 'ok' as const,
        (err: unknown) => {
          error = err;
          return 'failed' as const;
        },
      ),
      late,
    ]).finally(() => clearTimeout(timer));
    const before = this.#last.get(name);
    if (before !== result) {
      this.#last.set(name, result);
      if (result === 'ok') {
        if (before !== undefined) this.#log.info('readiness check passes again', { check: name });
      } else {
        this.#log.warn('readiness check failing', { check: name, result, ...(error === undefined ? { timeoutMs: this.#timeoutMs } : { err: error }) });
      }
    }
    return result;
  }
}
