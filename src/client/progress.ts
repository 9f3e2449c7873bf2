/**
 * Progress of a push for people: on a terminal one bar redrawn in place (rows, MB/s, ETA),
 * elsewhere (a log, a pipe) one plain line per package, retry and failure. Rates count the
 * file's bytes whose packages the service accepted, since the first package was sent.
 */
import { describeDetail, isApiError } from './errors.js';
import type { PushEvent } from './push.js';

export type ProgressMode = 'bar' | 'plain' | 'none';

interface Sink {
  write(text: string): unknown;
  columns?: number;
}

const REDRAW_MS = 200;

export class PushProgress {
  #rows = 0;
  #sourceBytes = 0;
  #packages = 0;
  #retries = 0;
  #failed = 0;
  #startedAt: number | null = null;
  #timer: NodeJS.Timeout | null = null;
  #drawn = false;

  constructor(
    private readonly out: Sink,
    readonly mode: ProgressMode,
    private readonly label: string,
    private readonly totalBytes: number,
    private readonly now: () => number = () => performance.now(),
  ) {}

  onEvent = (event: PushEvent): void => {
    switch (event.type) {
      case 'sent':
        if (this.#startedAt === null) {
          this.#startedAt = this.now();
          if (this.mode === 'bar') this.#timer = setInterval(() => this.#draw(), REDRAW_MS).unref();
        }
        return;
      case 'accepted':
        this.#rows += event.rows;
        this.#sourceBytes += event.sourceBytes;
        this.#packages++;
        if (this.mode === 'plain') {
          const how = event.replayed ? 'already stored' : 'accepted';
          this.#line(`package ${event.index} ${how}: ${fmtCount(event.rows, 'row')} (${fmtCount(this.#rows, 'row')}, ${this.#stats()})`);
        }
        return;
      case 'retry': {
        this.#retries++;
        const why = isApiError(event.error) ? `${event.error.status} ${describeDetail(event.error.body)}` : event.error.message;
        this.#line(`package ${event.index}: ${why}; retry ${event.retry} in ${(event.delayMs / 1000).toFixed(1)} s`);
        return;
      }
      case 'failed': {
        this.#failed++;
        const f = event.failure;
        const where = f.record !== undefined ? ` (file record ${f.record})` : ` (file records ${f.first_record}–${f.first_record + f.rows - 1})`;
        this.#line(`package ${event.index} failed: ${f.status ?? f.code} ${f.message}${where}`);
        return;
      }
    }
  };

  /** Stops redrawing and leaves the cursor on a fresh line. */
  finish(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
    if (this.mode === 'bar' && this.#startedAt !== null) {
      this.#draw();
      this.out.write('\n');
      this.#drawn = false;
    }
  }

  #line(text: string): void {
    if (this.mode === 'none') return;
    if (this.mode === 'bar' && this.#drawn) this.out.write('\r\x1b[2K');
    this.out.write(`${text}\n`);
    if (this.mode === 'bar' && this.#drawn) this.#draw();
  }

  #draw(): void {
    const fraction = this.totalBytes > 0 ? Math.min(1, this.#sourceBytes / this.totalBytes) : 0;
    let tail = `${String(Math.floor(fraction * 100)).padStart(3)}% ${fmtCount(this.#rows, 'row')} · ${this.#stats()}`;
    if (this.#retries) tail += ` · ${fmtCount(this.#retries, 'retry', 'retries')}`;
    if (this.#failed) tail += ` · ${this.#failed} failed`;
    const columns = this.out.columns || 120; // 0 on a pty with no size
    // The bar takes what the label and the figures leave, 10 to 24 cells; a narrow terminal cuts the label.
    const width = Math.max(10, Math.min(24, columns - 1 - tail.length - this.label.length - 2));
    const filled = Math.round(fraction * width);
    const bar = `${'█'.repeat(filled)}${'░'.repeat(width - filled)}`;
    const room = Math.max(0, columns - 1 - tail.length - width - 2);
    const label = this.label.length > room ? this.label.slice(0, Math.max(0, room - 1)) + (room > 0 ? '…' : '') : this.label;
    let text = `${label}${label ? ' ' : ''}${bar} ${tail}`;
    if (text.length > columns - 1) text = text.slice(0, columns - 1);
    this.out.write(`\r\x1b[2K${text}`);
    this.#drawn = true;
  }

  #stats(): string {
    const seconds = this.#startedAt === null ? 0 : (this.now() - this.#startedAt) / 1000;
    const rate = seconds > 0 ? this.#sourceBytes / seconds : 0;
    const remaining = Math.max(0, this.totalBytes - this.#sourceBytes);
    const eta = rate > 0 ? fmtDuration(remaining / rate) : '–';
    return `${fmtMB(this.#sourceBytes)} of ${fmtMB(this.totalBytes)} MB of the file · ${(rate / 1e6).toFixed(1)} MB/s · ETA ${eta}`;
  }
}

export function fmtInt(n: number): string {
  return n.toLocaleString('en-US');
}

/** `1 row`, `2 rows`, `1,000 packages`: a count and its noun, singular for exactly one. */
export function fmtCount(n: number, noun: string, plural = `${noun}s`): string {
  return `${fmtInt(n)} ${n === 1 ? noun : plural}`;
}

function fmtMB(bytes: number): string {
  return (bytes / 1e6).toFixed(1);
}

export function fmtDuration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = String(s % 60).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${sec}` : `${m}:${sec}`;
}
