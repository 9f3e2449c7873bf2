import type { Dirent } from 'node:fs';
import { mkdir, open, readdir, rm, rmdir, stat, unlink, type FileHandle } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { crc32 } from 'node:zlib';
import { StoreError, type ObjectStore, type StoredObject } from '../ports.js';
import { fsyncDir } from '../../durable-file.js';
import { AppendFile } from './append-file.js';
import { OpenHandles } from './open-handles.js';

export interface FileObjectStoreOptions {
  /** Index entries kept in memory over all directories; beyond it the least recently used directories are read again when asked. Default 500,000. */
  maxIndexedObjects?: number;
  /** Directories whose pack files are kept open. Default 64. */
  maxOpenPacks?: number;
}

/** A directory's pack file; no escaped segment starts with `~`, so it never meets a key's name. */
const PACK = '~pack';

/**
 * A record's header line: an object `k` of `n` bytes whose CRC-32 is `c` (its bytes follow the
 * line); `n: -1`: an object still being streamed (or whose put died mid-stream); `c: -1`: `n`
 * bytes of an abandoned put, to be skipped; or, with `d: 1`, the removal of `k`. The numbers
 * are padded to a fixed width, so that a streamed object's header is written before its bytes
 * and completed in place after them.
 */
type Header = { k: string; n: number; c: number } | { k: string; d: 1 };

interface Located {
  o: number;
  n: number;
}

/** A directory's index as read so far: every key's last entry, where the last whole record ends, and the reads in turn. */
interface DirIndex {
  entries: Map<string, Located>;
  readTo: number;
  reading: Promise<void>;
}

/** A directory's open pack, and the put that streams alone, if any. */
interface Pack {
  file: AppendFile;
  /** A put too large to hold whole writes its chunks one after another: the others wait for it. */
  streaming: Promise<void> | null;
}

/**
 * `ObjectStore` on local files under `<dir>/objects/`, one directory per key segment (S3
 * lets `a/b` and `a/b/c` coexist, so every segment is escaped to `[a-z0-9._-]` plus `%xx`,
 * lower-case so that case-insensitive file systems keep `A` and `a` apart). The objects of
 * one directory (a session's packages of one entity) are packed into its `~pack` file: each
 * one a record, a header line `{k, n, c}` (key, size, CRC-32 of the bytes) and its bytes,
 * appended in one write and group-committed (`AppendFile`: one fdatasync for every put of
 * the directory that came meanwhile) — one write and one fdatasync per object, instead of a
 * file, an fsync, a rename and a directory fsync (or, packed with a separate index, two
 * writes and two fdatasyncs). A key's last record wins; `{k, d: 1}` removes it. Readers
 * scan the records once, in order, and keep the index in memory; a record counts once it is
 * whole and its bytes match its CRC, so a record torn by a crash (never acknowledged) ends
 * the scan, and the writer cuts it off when it opens the pack again.
 *
 * An object up to `HOLD_BYTES` is held whole and appended in one write, so puts into one
 * directory run side by side; a larger one streams its chunks in turn while the directory's
 * other puts wait. The space of a replaced object is reclaimed when its directory goes
 * (deletePrefix). Files of the one-file-per-object layout of earlier versions (`<name>~`)
 * are still read, listed and deleted; a put of the same key shadows them. One process
 * writes a store; others may read it (each read takes what the index holds at that moment).
 */
export class FileObjectStore implements ObjectStore {
  /** `put` writes each chunk out (or copies it) before it asks for the next. */
  readonly capabilities = { consumesChunksInTurn: true } as const;
  readonly #root: string;
  readonly #maxIndexed: number;
  /** Open packs per directory. */
  readonly #packs: OpenHandles<Pack>;
  /** Indexes read per directory, least recently used first. */
  readonly #indexes = new Map<string, DirIndex>();
  #indexed = 0;
  #closed = false;

  private constructor(dir: string, opts: FileObjectStoreOptions) {
    this.#root = join(dir, 'objects');
    this.#maxIndexed = opts.maxIndexedObjects ?? 500_000;
    this.#packs = new OpenHandles({ max: opts.maxOpenPacks ?? 64, open: (d) => this.#openPack(d), close: closePack });
  }

  static async open(dir: string, opts: FileObjectStoreOptions = {}): Promise<FileObjectStore> {
    const store = new FileObjectStore(dir, opts);
    // Temp files of the one-file-per-object layout, left by a crash of an earlier version.
    await rm(join(dir, 'tmp'), { recursive: true, force: true });
    await mkdir(store.#root, { recursive: true });
    return store;
  }

  async put(key: string, body: AsyncIterable<Uint8Array>): Promise<StoredObject> {
    const { dir } = this.#locate(key);
    // Held whole while it is small, after room for its header: chunks are copied, since the caller may reuse their memory.
    const headerBytes = header(key, 0, 0).byteLength;
    const held = new HeldBytes(headerBytes);
    const iterator = body[Symbol.asyncIterator]();
    let next = await iterator.next();
    while (!next.done && held.size + next.value.byteLength <= HOLD_BYTES) {
      held.add(next.value);
      next = await iterator.next();
    }
    if (next.done) {
      const record = held.record(header(key, held.size, crc32(held.bytes())));
      return this.#withPack(dir, async (pack) => {
        while (pack.streaming) await pack.streaming;
        const { offset, written } = pack.file.write(record);
        await written;
        await pack.file.sync();
        this.#learn(dir, key, offset, record.byteLength - held.size, held.size);
        return { key, size: held.size };
      });
    }
    // Too large to hold: it streams alone, the directory's other puts wait. A failure of the
    // body ends the put, not the pack: the record is marked abandoned and the pack goes on.
    const outcome = await this.#withPack(dir, async (pack) => {
      while (pack.streaming) await pack.streaming;
      let done!: () => void;
      pack.streaming = new Promise<void>((resolve) => (done = resolve));
      try {
        const at = pack.file.size;
        // Still streaming (n -1): not an object until completed in place.
        await pack.file.write(header(key, -1, ABANDONED)).written;
        let size = 0;
        let crc = 0;
        const add = async (chunk: Uint8Array): Promise<void> => {
          await pack.file.write(chunk).written;
          crc = crc32(chunk, crc);
          size += chunk.byteLength;
        };
        let failure: { err: unknown } | null = null;
        try {
          if (held.size > 0) await add(held.bytes());
          for (; !next.done; next = await iterator.next()) await add(next.value);
        } catch (err) {
          failure = { err };
        }
        const head = header(key, size, failure ? ABANDONED : crc);
        await pack.file.writeAt(head, at);
        await pack.file.sync();
        if (!failure) this.#learn(dir, key, at, head.byteLength, size);
        return failure ?? { key, size };
      } finally {
        pack.streaming = null;
        done();
      }
    });
    if ('err' in outcome) throw outcome.err;
    return outcome;
  }

  async get(key: string): Promise<AsyncIterable<Uint8Array> | null> {
    const { dir, legacy } = this.#locate(key);
    const at = (await this.#index(dir)).entries.get(key);
    if (at) {
      if (at.n === 0) return (async function* () {})();
      // An open handle keeps reading the bytes even if the directory is removed meanwhile.
      return (await open(join(dir, PACK), 'r')).createReadStream({ start: at.o, end: at.o + at.n - 1 });
    }
    try {
      // An open handle keeps reading the old file even if it is removed meanwhile.
      return (await open(legacy, 'r')).createReadStream();
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
      throw err;
    }
  }

  async list(prefix: string): Promise<StoredObject[]> {
    this.#check();
    const found = new Map<string, number>();
    await this.#walk(prefix, async (dir, keyDir, entries) => {
      for (const e of entries) {
        if (!e.isFile() || !e.name.endsWith('~') || e.name.startsWith('~')) continue;
        const key = keyDir + unescapeSegment(e.name.slice(0, -1));
        if (!key.startsWith(prefix)) continue;
        try {
          found.set(key, (await stat(join(dir, e.name))).size);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
        }
      }
      if (!entries.some((e) => e.name === PACK)) return;
      for (const [key, at] of (await this.#index(dir)).entries) if (key.startsWith(prefix)) found.set(key, at.n);
    });
    // S3 lists in UTF-8 byte order.
    return [...found]
      .map(([key, size]) => ({ key, size }))
      .sort((a, b) => Buffer.compare(Buffer.from(a.key), Buffer.from(b.key)));
  }

  async deletePrefix(prefix: string): Promise<void> {
    this.#check();
    const whole: string[] = [];
    await this.#walk(prefix, async (dir, keyDir, entries) => {
      if (keyDir.startsWith(prefix) && dir !== this.#root) {
        // Every key below starts with the prefix: the directory goes whole (its subdirectories with it).
        whole.push(dir);
        return 'skip';
      }
      for (const e of entries) {
        if (e.isFile() && e.name.endsWith('~') && !e.name.startsWith('~') && (keyDir + unescapeSegment(e.name.slice(0, -1))).startsWith(prefix)) {
          await unlink(join(dir, e.name)).catch(ignoreMissing);
        }
      }
      if (!entries.some((e) => e.name === PACK)) return;
      const gone = [...(await this.#index(dir)).entries.keys()].filter((k) => k.startsWith(prefix));
      if (gone.length === 0) return;
      await this.#withPack(dir, async (pack) => {
        while (pack.streaming) await pack.streaming;
        await pack.file.append(Buffer.from(gone.map((k) => `${JSON.stringify({ k, d: 1 } satisfies Header)}\n`).join('')));
      });
    });
    for (const dir of whole) {
      // Puts still writing into a pack of what goes finish there (the delete took their objects); later ones make a new one.
      this.#packs.retire((d) => d === dir || d.startsWith(`${dir}/`));
      for (const d of [...this.#indexes.keys()].filter((d) => d === dir || d.startsWith(`${dir}/`))) this.#forget(d);
      // A put that began after the delete may make the directory again while it is removed:
      // its object stays (as a put after a delete does on S3), the rest goes.
      await rm(dir, { recursive: true, force: true, maxRetries: 3, retryDelay: 5 }).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== 'ENOTEMPTY') throw err;
      });
    }
    // Directories left empty above what went.
    for (const dir of whole) {
      for (let d = dirname(dir); d !== this.#root && d.startsWith(this.#root); d = dirname(d)) {
        if (!(await rmdir(d).then(() => true, () => false))) break;
      }
    }
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#packs.closeAll();
  }

  /**
   * Visits the directories whose keys may start with `prefix`, from the deepest one every such
   * key lives under; `visit` returning 'skip' does not descend.
   */
  async #walk(
    prefix: string,
    visit: (dir: string, keyDir: string, entries: Dirent[]) => Promise<void | 'skip'>,
  ): Promise<void> {
    const complete = prefix.split('/').slice(0, -1);
    if (complete.some((s) => s === '' || s === '.' || s === '..')) return;
    const go = async (dir: string, keyDir: string): Promise<void> => {
      let entries;
      try {
        entries = await readdir(dir, { withFileTypes: true });
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
        throw err;
      }
      if ((await visit(dir, keyDir, entries)) === 'skip') return;
      for (const e of entries) {
        if (!e.isDirectory()) continue;
        const sub = keyDir + unescapeSegment(e.name) + '/';
        if (sub.startsWith(prefix) || prefix.startsWith(sub)) await go(join(dir, e.name), sub);
      }
    };
    await go(join(this.#root, ...complete.map(escapeSegment)), complete.map((s) => `${s}/`).join(''));
  }

  /** The directory's index, brought up to what its file holds now (reads of one directory go in turn). */
  async #index(dir: string): Promise<DirIndex> {
    let index = this.#indexes.get(dir);
    if (index) this.#indexes.delete(dir); // most recently used last
    else index = { entries: new Map(), readTo: 0, reading: Promise.resolve() };
    this.#indexes.set(dir, index);
    const mine = index.reading.then(() => this.#readMore(dir, index));
    index.reading = mine.catch(() => undefined);
    await mine;
    return index;
  }

  /**
   * Reads the records appended since the last read, up to the first one that is not whole
   * (still being written, or torn by a crash: it waits for the next read, or is cut off when
   * the writer opens the pack).
   */
  async #readMore(dir: string, index: DirIndex): Promise<void> {
    let fh;
    try {
      fh = await open(join(dir, PACK), 'r');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      // Gone (deleted), or never made: nothing is there.
      this.#forget(dir);
      index.entries.clear();
      index.readTo = 0;
      return;
    }
    try {
      const size = (await fh.stat()).size;
      if (size <= index.readTo) return;
      const before = index.entries.size;
      const reader = new RecordReader(fh, index.readTo, size);
      for (;;) {
        const rec = await reader.next();
        if (!rec) break;
        if ('d' in rec.header) index.entries.delete(rec.header.k);
        else if (rec.header.c !== ABANDONED) index.entries.set(rec.header.k, { o: rec.offset, n: rec.header.n });
        index.readTo = rec.end;
      }
      if (this.#indexes.get(dir) === index) {
        this.#indexed += index.entries.size - before;
        this.#evict(dir);
      }
    } finally {
      await fh.close();
    }
  }

  /**
   * A record this store just made durable joins the directory's index when it is the next one
   * a scan would read, so that the writer never reads its own records back; otherwise the
   * next scan finds it.
   */
  #learn(dir: string, key: string, at: number, headerBytes: number, n: number): void {
    const index = this.#indexes.get(dir);
    if (!index || index.readTo !== at) return;
    const had = index.entries.has(key);
    index.entries.set(key, { o: at + headerBytes, n });
    index.readTo = at + headerBytes + n;
    if (!had) {
      this.#indexed++;
      this.#evict(dir);
    }
  }

  #forget(dir: string): void {
    const index = this.#indexes.get(dir);
    if (!index) return;
    this.#indexed -= index.entries.size;
    this.#indexes.delete(dir);
  }

  /** Forgets least recently used directories (never `keep`) until the indexes fit. */
  #evict(keep: string): void {
    for (const dir of this.#indexes.keys()) {
      if (this.#indexed <= this.#maxIndexed) return;
      if (dir !== keep) this.#forget(dir);
    }
  }

  /** Runs `fn` with the directory's pack; a failure retires it (its tail is unknown): the next put opens it afresh. */
  #withPack<R>(dir: string, fn: (pack: Pack) => Promise<R>): Promise<R> {
    this.#check();
    return this.#packs.use(dir, fn);
  }

  /**
   * Opens (making them, and the directories above, durable when new) a directory's pack. A
   * concurrent deletePrefix may remove a freshly made directory: it is made again.
   */
  async #openPack(dir: string): Promise<Pack> {
    for (let tries = 0; ; tries++) {
      const created = await mkdir(dir, { recursive: true });
      try {
        // Appends go after the last whole record: a torn one (a crash mid-put) is cut off.
        const { readTo } = await this.#index(dir);
        const file = await AppendFile.open(join(dir, PACK), { size: readTo });
        // The entries of the directories made for it must reach the disk (AppendFile made the files' own durable).
        if (created) {
          for (let d = dirname(dir); d.length >= dirname(created).length && d.startsWith(this.#root); d = dirname(d)) {
            await fsyncDir(d).catch(ignoreMissing);
            if (d === dirname(created) || d === this.#root) break;
          }
        }
        return { file, streaming: null };
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || tries >= 3) throw err;
      }
    }
  }

  #check(): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Object store is closed');
  }

  /** The key's directory, and the file it had in the one-file-per-object layout. */
  #locate(key: string): { dir: string; legacy: string } {
    this.#check();
    const segments = key.split('/');
    if (segments.some((s) => s === '' || s === '.' || s === '..')) {
      throw new StoreError('STORE_INVALID_KEY', `Invalid object key ${JSON.stringify(key)}: no empty, "." or ".." segments, no leading or trailing "/"`);
    }
    const last = segments.pop() as string;
    const dir = join(this.#root, ...segments.map(escapeSegment));
    return { dir, legacy: join(dir, `${escapeSegment(last)}~`) };
  }
}

/** Objects up to this size are held whole and appended in one write (see the class). */
const HOLD_BYTES = 4 * 1024 * 1024;

/**
 * Chunks copied into one buffer as they come (grown by doubling), after `room` bytes left for
 * the record's header: one allocation and one write for a small object, not a copy per chunk,
 * a concatenation and a write for the header.
 */
class HeldBytes {
  readonly #room: number;
  #buf: Buffer;
  size = 0;

  constructor(room: number) {
    this.#room = room;
    this.#buf = Buffer.allocUnsafe(room);
  }

  add(chunk: Uint8Array): void {
    const need = this.#room + this.size + chunk.byteLength;
    if (need > this.#buf.byteLength) {
      const grown = Buffer.allocUnsafe(Math.max(need, Math.min(this.#room + HOLD_BYTES, 2 * this.#buf.byteLength)));
      this.#buf.copy(grown, this.#room, this.#room, this.#room + this.size);
      this.#buf = grown;
    }
    this.#buf.set(chunk, this.#room + this.size);
    this.size += chunk.byteLength;
  }

  /** The object's bytes. */
  bytes(): Buffer {
    return this.#buf.subarray(this.#room, this.#room + this.size);
  }

  /** The whole record: `head` (exactly `room` bytes) and the object's bytes. */
  record(head: Buffer): Buffer {
    head.copy(this.#buf, 0);
    return this.#buf.subarray(0, this.#room + this.size);
  }
}

async function closePack(pack: Pack): Promise<void> {
  await pack.file.close();
}

/** Width the header's numbers are padded to: `n` up to 2^53, `c` a CRC-32 (or -1). */
const N_WIDTH = 16;
const C_WIDTH = 10;

/** The `c` of a record whose put failed: its `n` bytes are skipped by readers. */
const ABANDONED = -1;

/** A record's header line (see `Header`). */
function header(key: string, n: number, c: number): Buffer {
  return Buffer.from(`{"k":${JSON.stringify(key)},"n":${String(n).padEnd(N_WIDTH)},"c":${String(c).padEnd(C_WIDTH)}}\n`);
}

/** Reads a pack's records in order from `from` up to `size`, checking each one whole against its CRC. */
class RecordReader {
  readonly #fh: FileHandle;
  #pos: number;
  readonly #size: number;
  #buf = Buffer.allocUnsafe(64 * 1024);
  /** Bytes of `#buf` read, from file offset `#bufAt`. */
  #bufAt = 0;
  #bufLen = 0;

  constructor(fh: FileHandle, from: number, size: number) {
    this.#fh = fh;
    this.#pos = from;
    this.#size = size;
  }

  /** The next whole record (`offset` of its bytes, `end` of the record), or null at the end or at one not whole. */
  async next(): Promise<{ header: Header; offset: number; end: number } | null> {
    const line = await this.#line();
    if (!line) return null;
    let h: Header;
    try {
      h = JSON.parse(line.text) as Header;
    } catch {
      return null; // torn
    }
    if ('d' in h) {
      this.#pos = line.end;
      return { header: h, offset: line.end, end: line.end };
    }
    if (!Number.isSafeInteger(h.n) || h.n < 0 || line.end + h.n > this.#size) return null; // still streaming, or torn
    if (h.c !== ABANDONED) {
      let crc = 0;
      for (let at = line.end; at < line.end + h.n; ) {
        const part = await this.#bytes(at, Math.min(this.#buf.byteLength, line.end + h.n - at));
        crc = crc32(part, crc);
        at += part.byteLength;
      }
      if (crc !== h.c) return null; // torn: its bytes are not what was written
    }
    this.#pos = line.end + h.n;
    return { header: h, offset: line.end, end: this.#pos };
  }

  /** The header line at the position (without its newline), or null if it does not end before the file does. */
  async #line(): Promise<{ text: string; end: number } | null> {
    for (let want = 1024; ; want *= 2) {
      if (this.#pos >= this.#size) return null;
      const chunk = await this.#bytes(this.#pos, Math.min(want, this.#size - this.#pos));
      const nl = chunk.indexOf(0x0a);
      if (nl >= 0) return { text: chunk.subarray(0, nl).toString('utf8'), end: this.#pos + nl + 1 };
      if (this.#pos + chunk.byteLength >= this.#size || want > 1024 * 1024) return null;
    }
  }

  /** Up to `length` bytes at `at` (at least one), through the buffer. */
  async #bytes(at: number, length: number): Promise<Buffer> {
    if (at < this.#bufAt || at + length > this.#bufAt + this.#bufLen) {
      if (length > this.#buf.byteLength) this.#buf = Buffer.allocUnsafe(length);
      const { bytesRead } = await this.#fh.read(this.#buf, 0, Math.max(length, Math.min(this.#buf.byteLength, this.#size - at)), at);
      this.#bufAt = at;
      this.#bufLen = bytesRead;
      if (bytesRead === 0) throw new StoreError('STORE_CORRUPT', 'Pack file shrank while it was read');
    }
    return this.#buf.subarray(at - this.#bufAt, Math.min(at - this.#bufAt + length, this.#bufLen));
  }
}

function ignoreMissing(err: NodeJS.ErrnoException): void {
  if (err.code !== 'ENOENT') throw err;
}

function escapeSegment(segment: string): string {
  if (PLAIN_SEGMENT.test(segment)) return segment;
  let out = '';
  for (const byte of Buffer.from(segment, 'utf8')) {
    const c = String.fromCharCode(byte);
    out += /[a-z0-9._-]/.test(c) ? c : `%${byte.toString(16).padStart(2, '0')}`;
  }
  return out;
}

/** A segment that escapes to itself. */
const PLAIN_SEGMENT = /^[a-z0-9._-]*$/;

function unescapeSegment(name: string): string {
  return Buffer.from(name.replace(/%([0-9a-f]{2})/g, (_, h: string) => String.fromCharCode(parseInt(h, 16))), 'latin1').toString('utf8');
}
