import { open, type FileHandle } from 'node:fs/promises';
import { withDeadline } from '../../deadline.js';
import { fsyncEntry } from '../../durable-file.js';
import { StoreError } from '../ports.js';

/**
 * An append-only file with group commit: `write` places bytes at the end at once (offsets
 * are handed out synchronously, writes run concurrently), and `sync` resolves once an
 * fdatasync that began after every earlier write completed. Syncs asked for while one runs
 * share the next one, so one fdatasync makes durable whatever many writers (packages,
 * sessions) appended meanwhile: an fdatasync costs about 0.3 ms on the build machine
 * (docs/performance.md), and is paid once per group instead of once per package.
 *
 * Writes are coalesced the same way: one `writev` at a time per file, and the writes asked
 * for while it runs go out together in the next. Each write is a round trip to libuv's
 * thread pool, which costs the event loop more than the few kilobytes a package appends.
 *
 * With `timeoutMs`, an open, a write or a sync the disk has not finished by then fails its
 * caller (`STORE_UNAVAILABLE`: a frozen or hung device) and breaks the file; the call itself
 * is still out, and `settled` and `close` wait for it.
 */
export class AppendFile {
  readonly path: string;
  readonly #fh: FileHandle;
  #end: number;
  readonly #writes = new Set<Promise<void>>();
  /** Writes asked for while one is in the file's hands: they go out together, at `offset`. */
  #batch: { offset: number; parts: Uint8Array[]; written: Promise<void>; run(): void } | null = null;
  #writing = false;
  #calls = 0;
  #syncing: Promise<void> | null = null;
  #queued: Promise<void> | null = null;
  #closed = false;
  /** The first write or fdatasync error: the file's tail is unknown from then on, so every later call fails. */
  #broken: unknown = null;
  /** Where the bytes the last successful fdatasync covered end (see `durableSize`). */
  #durable: number;
  /** `writeAt` calls so far: a sync that ran alongside one does not vouch for its bytes. */
  #rewrites = 0;
  readonly #overwrites = new Set<Promise<void>>();
  readonly #timeoutMs: number | undefined;

  private constructor(path: string, fh: FileHandle, size: number, timeoutMs: number | undefined) {
    this.path = path;
    this.#fh = fh;
    this.#end = size;
    this.#durable = size;
    this.#timeoutMs = timeoutMs;
  }

  /**
   * Opens (creating it, and making its name durable, if missing, unless `create` is false:
   * then a missing file fails with ENOENT; a name whose fsync failed is made durable at the
   * next open) for appending at `size` (default: the file's size); anything past `size` (a
   * torn tail) is cut off. `timeoutMs`: see the class.
   */
  static open(path: string, opts: { size?: number; create?: boolean; timeoutMs?: number } = {}): Promise<AppendFile> {
    const opening = AppendFile.#open(path, opts);
    // Opened after its caller gave up: closed, so that no handle is left to the garbage collector.
    return withDeadline(opening, opts.timeoutMs, () => notAnswered(path, 'open', opts.timeoutMs!), (late) => void late.close().catch(() => undefined));
  }

  static async #open(path: string, opts: { size?: number; create?: boolean; timeoutMs?: number }): Promise<AppendFile> {
    let fh: FileHandle;
    let created = false;
    try {
      fh = await open(path, 'r+');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || opts.create === false) throw err;
      fh = await open(path, 'wx+');
      created = true;
    }
    try {
      const actual = (await fh.stat()).size;
      const size = opts.size ?? actual;
      if (size < actual) {
        await fh.truncate(size);
        await fh.datasync();
      }
      await fsyncEntry(path, created);
      return new AppendFile(path, fh, size, opts.timeoutMs);
    } catch (err) {
      await fh.close();
      throw err;
    }
  }

  /**
   * Opens a file of lines for appending (see `open`): after a torn last line (a crash in the
   * middle of a write) the next write starts on a line of its own, so the torn line stays one
   * unreadable line instead of taking the next one with it.
   */
  static async openLines(path: string): Promise<AppendFile> {
    const file = await AppendFile.open(path);
    if (file.size > 0) {
      const last = Buffer.alloc(1);
      await file.read(last, file.size - 1);
      if (last[0] !== 0x0a) await file.write(Buffer.from('\n')).written;
    }
    return file;
  }

  /** Writes handed to the file so far (each one `write` or `writev`, however many `write` calls it carried). */
  get fileWrites(): number {
    return this.#calls;
  }

  /** Bytes written or being written. */
  get size(): number {
    return this.#end;
  }

  /**
   * Bytes known to be on the disk: the file's size at open, then the end of what the last
   * successful `sync` covered (lowered to where a `writeAt` overwrote bytes until a sync
   * covers them). After a failure, what lies past it is unknown: a caller that goes on with
   * the file cuts it back to here first (see `failed`).
   */
  get durableSize(): number {
    return this.#durable;
  }

  /**
   * The write or fdatasync error that broke the file, or null. A broken file refuses every
   * later call; its owner moves on to a fresh file, or reopens this one cut back to
   * `durableSize` once `settled` (no write of it is still in flight then).
   */
  get failed(): unknown {
    return this.#broken;
  }

  /** Appends `data`; returns its offset at once and, in `written`, when the bytes are in the file (not yet durable). */
  write(data: Uint8Array): { offset: number; written: Promise<void> } {
    this.#check();
    const offset = this.#end;
    this.#end += data.byteLength;
    if (this.#batch) {
      this.#batch.parts.push(data);
      return { offset, written: this.#deadline(this.#batch.written, 'write') };
    }
    const parts = [data];
    let run!: () => void;
    const written = new Promise<void>((resolve) => (run = resolve)).then(() => {
      // After a failed write the tail is unknown: what waited behind it fails as well.
      if (this.#broken) throw this.#broken;
      return this.#writeAt(parts, offset);
    }).catch((err: unknown) => {
      this.#broken ??= err;
      throw err;
    });
    this.#batch = { offset, parts, written, run };
    this.#writes.add(written);
    void written.then(
      () => this.#wrote(written),
      () => this.#wrote(written),
    );
    if (!this.#writing) this.#next();
    return { offset, written: this.#deadline(written, 'write') };
  }

  /** Hands the waiting batch to the file: from now on, new writes start the next one. */
  #next(): void {
    const batch = this.#batch;
    if (!batch) return;
    this.#batch = null;
    this.#writing = true;
    batch.run();
  }

  #wrote(written: Promise<void>): void {
    this.#writes.delete(written);
    this.#writing = false;
    this.#next();
  }

  /** Resolves once every write issued before this call is durable. */
  sync(): Promise<void> {
    this.#check();
    if (this.#queued) return this.#deadline(this.#queued, 'fdatasync');
    if (!this.#syncing) return this.#deadline(this.#startSync(), 'fdatasync');
    const queued = this.#syncing.then(
      () => this.#startSync(),
      () => this.#startSync(),
    );
    this.#queued = queued;
    return this.#deadline(queued, 'fdatasync');
  }

  /** `write` then `sync`: resolves with the offset once the bytes are durable. */
  async append(data: Uint8Array): Promise<number> {
    const { offset, written } = this.write(data);
    await Promise.all([written, this.sync()]);
    return offset;
  }

  /** Resolves once every write issued so far is in the file (or failed). */
  async settled(): Promise<void> {
    await Promise.allSettled([...this.#writes]);
  }

  /**
   * Overwrites bytes already appended, at `offset` (a record's header completed in place once
   * its bytes are written); resolves once they are in the file. Waits for the writes before it.
   */
  async writeAt(data: Uint8Array, offset: number): Promise<void> {
    this.#check();
    if (offset < 0 || offset + data.byteLength > this.#end) throw new RangeError(`${this.path}: writeAt past the end (${offset + data.byteLength} > ${this.#end})`);
    this.#rewrites++;
    this.#durable = Math.min(this.#durable, offset);
    await this.settled();
    if (this.#broken) throw this.#broken;
    const write = this.#writeAt([data], offset);
    // A sync asked for from now on waits for it.
    this.#overwrites.add(write);
    try {
      await write;
    } catch (err) {
      this.#broken ??= err;
      throw err;
    } finally {
      this.#overwrites.delete(write);
    }
  }

  /**
   * Cuts the file back to `size`, dropping what was appended past it (a streamed record whose
   * body failed); resolves once the file is that long. Waits for the writes before it; the
   * caller appends nothing meanwhile. Not durable until the next `sync`: a crash before it may
   * leave the dropped bytes, a tail no reader takes for a record. A failure breaks the file
   * like a failed write.
   */
  async truncate(size: number): Promise<void> {
    this.#check();
    if (size < 0 || size > this.#end) throw new RangeError(`${this.path}: truncate past the end (${size} > ${this.#end})`);
    await this.settled();
    if (this.#broken) throw this.#broken;
    try {
      await this.#fh.truncate(size);
    } catch (err) {
      this.#broken ??= err;
      throw err;
    }
    this.#end = size;
    this.#durable = Math.min(this.#durable, size);
  }

  async read(buf: Uint8Array, offset: number): Promise<void> {
    for (let done = 0; done < buf.byteLength; ) {
      const { bytesRead } = await this.#fh.read(buf, done, buf.byteLength - done, offset + done);
      if (bytesRead === 0) throw new StoreError('STORE_CORRUPT', `${this.path}: read past the end (${offset + done})`);
      done += bytesRead;
    }
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.allSettled([...this.#writes, this.#syncing, this.#queued]);
    await this.#fh.close();
  }

  #startSync(): Promise<void> {
    this.#queued = null;
    const writes = [...this.#writes, ...this.#overwrites];
    const upTo = this.#end;
    const rewrites = this.#rewrites;
    const run = (async () => {
      await Promise.all(writes);
      if (this.#broken) throw this.#broken;
      try {
        await this.#fh.datasync();
        if (this.#rewrites === rewrites) this.#durable = Math.max(this.#durable, upTo);
      } catch (err) {
        // After a failed fdatasync what reached the disk is unknown (the kernel may have dropped
        // the dirty pages): the file is broken like after a failed write.
        this.#broken ??= err;
        throw err;
      }
    })();
    this.#syncing = run;
    void run.then(
      () => this.#settled(run),
      () => this.#settled(run),
    );
    return run;
  }

  #settled(run: Promise<void>): void {
    if (this.#syncing === run) this.#syncing = null;
  }

  async #writeAt(parts: Uint8Array[], offset: number): Promise<void> {
    this.#calls++;
    if (parts.length === 1) {
      const [data] = parts as [Uint8Array];
      for (let done = 0; done < data.byteLength; ) {
        const { bytesWritten } = await this.#fh.write(data, done, data.byteLength - done, offset + done);
        done += bytesWritten;
      }
      return;
    }
    const total = parts.reduce((n, p) => n + p.byteLength, 0);
    const { bytesWritten } = await this.#fh.writev(parts, offset);
    // A regular file takes a writev whole but for a full disk or a signal; the rest goes on alone.
    if (bytesWritten < total) await this.#writeAt([Buffer.concat(parts).subarray(bytesWritten)], offset + bytesWritten);
  }

  #check(): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', `${this.path} is closed`);
    if (this.#broken) throw this.#broken;
  }

  /** `op` for its caller, failed at `timeoutMs` (which breaks the file: what it wrote is unknown from then on). */
  #deadline(op: Promise<void>, what: string): Promise<void> {
    return withDeadline(op, this.#timeoutMs, () => {
      const err = notAnswered(this.path, what, this.#timeoutMs!);
      this.#broken ??= err;
      return err;
    });
  }
}

function notAnswered(path: string, what: string, timeoutMs: number): StoreError {
  return new StoreError('STORE_UNAVAILABLE', `${path}: the disk did not answer a ${what} within ${timeoutMs} ms`);
}
