import { jsonLogger, type Logger } from '../../log.js';

/**
 * Told of each damaged record an embedded store finds: the file, the offset where the
 * record starts, and what is wrong with it. A damaged record is one whose checksum fails
 * with valid records after it (a torn tail, the end of a write a crash cut short, is not).
 */
export type OnDamage = (file: string, offset: number, reason: string) => void;

let fallback: Logger | null = null;

/** Counts damaged records and hands each to `onDamage` (default: an error log line on stderr). */
export class DamageLog {
  readonly #onDamage: OnDamage;
  #count = 0;

  constructor(onDamage?: OnDamage) {
    this.#onDamage = onDamage ?? ((file, offset, reason) => (fallback ??= jsonLogger()).error('damaged record skipped', { file, offset, reason }));
  }

  /** Damaged records reported so far. */
  get count(): number {
    return this.#count;
  }

  report(file: string, offset: number, reason: string): void {
    this.#count++;
    this.#onDamage(file, offset, reason);
  }
}
