/**
 * Readiness: every check runs in parallel, each cut at one deadline. Concurrent probes share
 * one run, so a burst of probes costs one round of requests; a check still out past an
 * earlier run's deadline is waited for again, not started anew (a hung disk would otherwise
 * hold one more of libuv's few threads per probe). A check that changes state is logged once
 * (with its error when it fails), not once per probe.
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
  /** Checks still out, by name, with how they ended ('failed' with its error). */
  readonly #out = new Map<string, Promise<{ result: 'ok' | 'failed'; error?: unknown }>>();
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
    let out = this.#out.get(name);
    if (!out) {
      const started = check(this.#timeoutMs).then(
        () => ({ result: 'ok' as const }),
        (error: unknown) => ({ result: 'failed' as const, error }),
      );
      out = started.finally(() => this.#out.delete(name));
      this.#out.set(name, out);
    }
    const ended = await Promise.race([out, late]).finally(() => clearTimeout(timer));
    const result = ended === 'timeout' ? ended : ended.result;
    const error = ended === 'timeout' ? undefined : ended.error;
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
