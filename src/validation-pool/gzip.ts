/**
 * `Content-Encoding: gzip` in front of a sink. Node's async zlib stream inflates on the
 * libuv thread pool, so the main thread only moves chunks. The wire bytes are limited by
 * the HTTP edge; the inflated bytes by `maxBytes` here: past it inflating stops and the
 * answer is 413, as it would be for a plain path that inflates before it parses. A stream
 * that is not gzip, or is cut short, answers `Invalid JSON format.` (422).
 *
 * Back-pressure both ways: `write` returns false while zlib's input is full; zlib's output
 * pauses while the inner sink asks for a pause. Inflating stops as soon as the inner sink's
 * answer is decided (not JSON, too large, out of memory): the rest of a bomb is never inflated.
 */
import { Buffer } from 'node:buffer';
import { createGunzip, type Gunzip } from 'node:zlib';
import { INVALID_JSON } from '../entities/validators.js';
import { errors } from '../errors.js';
import type { IngestResult, IngestSink } from './types.js';

const OUTPUT_CHUNK = 256 * 1024;

export class GunzipIngest implements IngestSink {
  readonly #inner: IngestSink;
  readonly #maxBytes: number;
  readonly #zlib: Gunzip;
  /** Resolves when zlib ended, failed or was stopped. */
  readonly #done: Promise<void>;
  #inflated = 0;
  #stopped: 'gzip' | 'size' | 'abort' | 'decided' | null = null;
  #waiting = false;
  #drain: (() => void) | null = null;
  #innerPaused = false;
  #ended: Promise<IngestResult> | null = null;

  constructor(inner: IngestSink, maxBytes: number) {
    this.#inner = inner;
    this.#maxBytes = maxBytes;
    this.#zlib = createGunzip({ chunkSize: OUTPUT_CHUNK });
    this.#done = new Promise((resolve) => {
      this.#zlib.on('end', resolve);
      this.#zlib.on('close', resolve);
    });
    this.#zlib.on('error', () => this.#stop('gzip'));
    this.#zlib.on('data', (chunk: Buffer) => {
      if (this.#stopped) return;
      this.#inflated += chunk.byteLength;
      if (this.#inflated > this.#maxBytes) {
        this.#stop('size');
        return;
      }
      if (!this.#inner.write(chunk)) {
        this.#innerPaused = true;
        this.#zlib.pause();
      }
      if (this.#inner.decided) this.#stop('decided');
    });
    this.#zlib.on('drain', () => this.#release());
    inner.onDrain(() => {
      if (this.#innerPaused) {
        this.#innerPaused = false;
        if (!this.#stopped) this.#zlib.resume();
      }
    });
  }

  write(chunk: Uint8Array): boolean {
    if (this.#stopped || this.#ended) return true;
    // zlib keeps the chunk until it inflated it: a copy, the caller reuses its memory.
    if (this.#zlib.write(Buffer.from(chunk))) return true;
    this.#waiting = true;
    return false;
  }

  onDrain(cb: () => void): void {
    this.#drain = cb;
  }

  get decided(): boolean {
    return this.#stopped !== null || this.#inner.decided;
  }

  end(): Promise<IngestResult> {
    this.#ended ??= this.#finish();
    return this.#ended;
  }

  abort(): void {
    if (this.#stopped === 'abort') return;
    this.#stop('abort');
    this.#inner.abort();
  }

  async #finish(): Promise<IngestResult> {
    if (!this.#stopped) this.#zlib.end();
    await this.#done;
    if (this.#stopped === null || this.#stopped === 'abort' || this.#stopped === 'decided') return this.#inner.end();
    // The inner sink saw a prefix of the body: drop it, and wait until its writer is aborted.
    this.#inner.abort();
    await this.#inner.end().catch(() => {});
    throw this.#stopped === 'size' ? errors.bodyTooLarge(this.#maxBytes, true) : errors.invalidPayload(INVALID_JSON);
  }

  #stop(reason: 'gzip' | 'size' | 'abort' | 'decided'): void {
    if (this.#stopped) return;
    this.#stopped = reason;
    this.#zlib.destroy();
    this.#release();
  }

  #release(): void {
    if (!this.#waiting) return;
    this.#waiting = false;
    this.#drain?.();
  }
}
