import type { Dirent } from 'node:fs';
import { open, readdir, rm, rmdir, stat, unlink, type FileHandle } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { crc32 } from 'node:zlib';
import { StoreError, type ObjectStore, type StoredObject } from '../ports.js';
import { mkdirDurable } from '../../durable-file.js';
import { AppendFile } from './append-file.js';
import { DamageLog, type OnDamage } from './damage.js';
import { OpenHandles } from './open-handles.js';

export interface FileObjectStoreOptions {
  /** Index entries kept in memory over all directories; beyond it the least recently used directories are read again when asked. Default 500,000. */
  maxIndexedObjects?: number;
  /** Directories whose pack files are kept open. Default 64. */
  maxOpenPacks?: number;
  /**
   * Called for each damaged record found (default: an error log line): a record whose header
   * or bytes fail their CRC-32, with valid records after it. It is no object (the ones after
   * it are); a torn tail (the end of a put a crash cut short) is not damage.
   */
  onDamage?: OnDamage;
}

/** A directory's pack file; no escaped segment starts with `~`, so it never meets a key's name. */
const PACK = '~pack';

/**
 * A record's header line: an object `k` of `n` bytes whose CRC-32 is `c` (its bytes follow the
 * line); `n: -1`: an object still being streamed (or whose put died mid-stream); `c: -1`: `n`
 * bytes of an abandoned put, to be skipped; or, with `d: 1`, the removal of `k`. The numbers
 * are padded to a fixed width, so that a streamed object's header is written before its bytes
 * and completed in place after them. Each line ends with `h`, the CRC-32 of the line before
 * `,"h":` (lines of earlier versions have none: they are read until a pack's first checked one).
 */
type Header = { k: string; n: number; c: number } | { k: string; d: 1 };

interface Located {
  /** Offset of its bytes. */
  o: number;
  n: number;
  /** CRC-32 of its bytes. */
  c: number;
}

/**
 * A directory's index as read so far: every key's last entry, where the last whole record
 * ends, whether a checked header was read (older headers are refused after it), and the
 * reads in turn.
 */
interface DirIndex {
  entries: Map<string, Located>;
  readTo: number;
  checked: boolean;
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
 * whole, its header matches its own CRC-32 and its bytes theirs. Records that fail with
 * none valid after them are a torn tail (a put a crash cut short, never acknowledged): the
 * scan ends there, and the writer cuts them off when it opens the pack again. One that
 * fails with valid records after it is damage: reported (`onDamage`), skipped (after a
 * damaged header the scan looks for the next valid one), and the records after it count.
 * `get` checks an object's bytes against their CRC as it reads them: damaged bytes end the
 * read with `STORE_CORRUPT` before its last chunk.
 *
 * A failed write or fdatasync fails the puts it carried, not the directory: the pack is
 * closed, and the next put opens it again cut back to the end of its last successful
 * fdatasync, so no byte of a failed put is ever read as an object.
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
  /** Packs to cut back to this size before they are read or written again (a write or fdatasync of theirs failed). */
  readonly #cuts = new Map<string, number>();
  readonly #damage: DamageLog;
  /** Damage reported, by file and offset: a directory read again is not reported again. */
  readonly #reported = new Set<string>();
  #closed = false;

  private constructor(dir: string, opts: FileObjectStoreOptions) {
    this.#root = join(dir, 'objects');
    this.#maxIndexed = opts.maxIndexedObjects ?? 500_000;
    this.#packs = new OpenHandles({ max: opts.maxOpenPacks ?? 64, open: (d) => this.#openPack(d), close: closePack });
    this.#damage = new DamageLog(opts.onDamage);
  }

  static async open(dir: string, opts: FileObjectStoreOptions = {}): Promise<FileObjectStore> {
    const store = new FileObjectStore(dir, opts);
    // Temp files of the one-file-per-object layout, left by a crash of an earlier version.
    await rm(join(dir, 'tmp'), { recursive: true, force: true });
    await mkdirDurable(store.#root);
    return store;
  }

  /** Damaged records found so far (each also handed to `onDamage`). */
  get damaged(): number {
    return this.#damage.count;
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
      return this.#withPack(dir, async (pack) => {
        while (pack.streaming) await pack.streaming;
        const crc = crc32(held.bytes());
        const record = held.record(header(key, held.size, crc));
        const { offset, written } = pack.file.write(record);
        await written;
        await pack.file.sync();
        this.#learn(dir, key, offset, record.byteLength - held.size, held.size, crc);
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
        if (!failure) this.#learn(dir, key, at, head.byteLength, size, crc);
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
      return this.#checkedRead(await open(join(dir, PACK), 'r'), join(dir, PACK), at);
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
        await pack.file.append(Buffer.concat(gone.map((k) => deletion(k))));
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
   * An object's bytes from its pack, checked against their CRC as they are read: the last
   * chunk is handed out only once the whole matches, so damaged bytes end in `STORE_CORRUPT`.
   */
  async *#checkedRead(fh: FileHandle, path: string, at: Located): AsyncIterable<Uint8Array> {
    try {
      let crc = 0;
      let held: Buffer | null = null;
      for (let done = 0; done < at.n; ) {
        const chunk = Buffer.allocUnsafe(Math.min(READ_CHUNK, at.n - done));
        const { bytesRead } = await fh.read(chunk, 0, chunk.byteLength, at.o + done);
        if (bytesRead === 0) throw new StoreError('STORE_CORRUPT', `${path}: the object at ${at.o} ends before its ${at.n} bytes`);
        const got = chunk.subarray(0, bytesRead);
        crc = crc32(got, crc);
        done += bytesRead;
        if (held) yield held;
        held = got;
      }
      if (crc !== at.c) {
        this.#reportDamage(path, at.o, `an object's ${at.n} bytes fail their CRC-32 when read`);
        throw new StoreError('STORE_CORRUPT', `${path}: the object at ${at.o} is damaged (its bytes fail their CRC-32)`);
      }
      if (held) yield held;
    } finally {
      await fh.close();
    }
  }

  #reportDamage(file: string, offset: number, reason: string): void {
    const at = `${file}:${offset}`;
    if (this.#reported.has(at)) return;
    this.#reported.add(at);
    this.#damage.report(file, offset, reason);
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
    // No byte of a failed put is read.
    if (this.#cuts.has(dir)) await this.#cutBack(dir);
    let index = this.#indexes.get(dir);
    if (index) this.#indexes.delete(dir); // most recently used last
    else index = { entries: new Map(), readTo: 0, checked: false, reading: Promise.resolve() };
    this.#indexes.set(dir, index);
    const mine = index.reading.then(() => this.#readMore(dir, index));
    index.reading = mine.catch(() => undefined);
    await mine;
    return index;
  }

  /**
   * Reads the records appended since the last read, up to the end of the last valid one:
   * records not whole or failing their checks with none valid after them (still being
   * written, or torn by a crash) wait for the next read, or are cut off when the writer opens
   * the pack. One that fails with a valid record after it is read once more (a header being
   * completed in place may have been read half old, half new), then reported and skipped.
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
      const before = index.entries.size;
      if (size < index.readTo) {
        // Cut back (a failed put of another instance): read again from the start.
        index.entries.clear();
        index.readTo = 0;
        index.checked = false;
      }
      if (size <= index.readTo) return;
      const reader = new RecordReader(fh, index.readTo, size, index.checked);
      let suspects: { at: number; reason: string }[] = [];
      let rechecked = -1;
      for (;;) {
        const step = await reader.next();
        if (!step) break;
        if ('reason' in step) {
          suspects.push(step);
          if (!(await reader.skip(step, (f) => suspects.push(f)))) break;
          continue;
        }
        if (suspects.length > 0) {
          if (rechecked !== suspects[0]!.at) {
            rechecked = suspects[0]!.at;
            reader.restart(rechecked);
            suspects = [];
            continue;
          }
          for (const d of suspects) this.#reportDamage(join(dir, PACK), d.at, d.reason);
          suspects = [];
        }
        const h = step.header;
        if ('d' in h) index.entries.delete(h.k);
        else if (h.c !== ABANDONED) index.entries.set(h.k, { o: step.offset, n: h.n, c: h.c });
        index.readTo = step.end;
        index.checked ||= step.checked;
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
  #learn(dir: string, key: string, at: number, headerBytes: number, n: number, c: number): void {
    const index = this.#indexes.get(dir);
    if (!index || index.readTo !== at) return;
    const had = index.entries.has(key);
    index.entries.set(key, { o: at + headerBytes, n, c });
    index.readTo = at + headerBytes + n;
    index.checked = true;
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

  /**
   * Runs `fn` with the directory's pack; a failure retires it: the next put opens it afresh.
   * After a failed write or fdatasync the pack's tail is unknown (an fdatasync that failed may
   * leave the page cache holding bytes the disk does not): once no write of it is in flight,
   * the pack is marked to be cut back to its last durable byte before anyone reads or
   * appends to it again (`#index` does it).
   */
  #withPack<R>(dir: string, fn: (pack: Pack) => Promise<R>): Promise<R> {
    this.#check();
    return this.#packs.use(dir, async (pack) => {
      try {
        return await fn(pack);
      } catch (err) {
        if (pack.file.failed) {
          await pack.file.settled();
          this.#cuts.set(dir, Math.min(this.#cuts.get(dir) ?? Infinity, pack.file.durableSize));
          this.#forget(dir);
        }
        throw err;
      }
    });
  }

  /**
   * Opens (making them, and the directories above, durable when new) a directory's pack. A
   * concurrent deletePrefix may remove a freshly made directory: it is made again.
   */
  async #openPack(dir: string): Promise<Pack> {
    for (let tries = 0; ; tries++) {
      try {
        await mkdirDurable(dir);
        // Appends go after the last valid record: a torn one (a crash mid-put) is cut off.
        const { readTo } = await this.#index(dir);
        const file = await AppendFile.open(join(dir, PACK), { size: readTo });
        return { file, streaming: null };
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || tries >= 3) throw err;
      }
    }
  }

  /** Cuts a pack whose write failed back to its last durable byte (see `#withPack`); it stays marked until that succeeds. */
  async #cutBack(dir: string): Promise<void> {
    const size = this.#cuts.get(dir);
    if (size === undefined) return;
    let fh: FileHandle;
    try {
      fh = await open(join(dir, PACK), 'r+');
    } catch (err) {
      // Gone with its directory: nothing left to cut.
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      this.#cuts.delete(dir);
      return;
    }
    try {
      if ((await fh.stat()).size > size) await fh.truncate(size);
      await fh.datasync();
    } finally {
      await fh.close();
    }
    this.#cuts.delete(dir);
    this.#forget(dir);
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
  return sealed(`{"k":${JSON.stringify(key)},"n":${String(n).padEnd(N_WIDTH)},"c":${String(c).padEnd(C_WIDTH)}`);
}

/** The header line of the removal of `key`. */
function deletion(key: string): Buffer {
  return sealed(`{"k":${JSON.stringify(key)},"d":1`);
}

/** A header's fields closed with its own CRC-32 (of the bytes before `,"h":`) and a newline. */
function sealed(fields: string): Buffer {
  const crc = crc32(fields);
  return Buffer.from(`${fields}${H_FIELD}${String(crc).padEnd(C_WIDTH)}}\n`);
}

const H_FIELD = ',"h":';
const H_TAG = Buffer.from(H_FIELD);
const H_VALUE = /^(\d{1,10}) *\}$/;

/** A header line's header (the line without its newline), or why it is none; a line without `h` counts only while `legacy`. */
function parseHeader(line: Buffer, legacy: boolean): { header: Header; checked: boolean } | string {
  const at = line.lastIndexOf(H_TAG);
  if (at >= 0) {
    const value = H_VALUE.exec(line.subarray(at + H_TAG.length).toString('latin1'));
    if (!value || crc32(line.subarray(0, at)) !== Number(value[1])) return 'record header fails its CRC-32';
    // As written: it parses, and is of a known shape.
    const { k, n, c, d } = JSON.parse(line.toString('utf8')) as { k: string; n?: number; c?: number; d?: 1 };
    return { header: d === 1 ? { k, d } : { k, n: n!, c: c! }, checked: true };
  }
  if (!legacy) return 'record header without its checksum';
  let h: unknown;
  try {
    h = JSON.parse(line.toString('utf8'));
  } catch {
    return 'record header that does not parse';
  }
  return isLegacyHeader(h) ? { header: h, checked: false } : 'record header of no known shape';
}

/** A header as earlier versions wrote it: `{k, n, c}` or `{k, d: 1}`, nothing else. */
function isLegacyHeader(h: unknown): h is Header {
  if (typeof h !== 'object' || h === null || Array.isArray(h) || typeof (h as { k?: unknown }).k !== 'string') return false;
  const keys = Object.keys(h).sort().join();
  const { n, c, d } = h as { n?: unknown; c?: unknown; d?: unknown };
  return (keys === 'd,k' && d === 1) || (keys === 'c,k,n' && Number.isSafeInteger(n) && Number.isSafeInteger(c));
}

/** Bytes `get` reads at a time. */
const READ_CHUNK = 1024 * 1024;

/** How every header line starts. */
const HEADER_START = Buffer.from('{"k":');

/** A header line longer than this is no header. */
const MAX_HEADER_BYTES = 1024 * 1024;

/** A record read whole and valid: `offset` of its bytes, `end` of the record, and whether its header carried a checksum. */
interface ValidRecord {
  header: Header;
  offset: number;
  end: number;
  checked: boolean;
}

/** A record that fails its checks though whole: where it starts, why, and where the next one starts if its header was valid. */
interface FailedRecord {
  at: number;
  reason: string;
  next: number | null;
}

/** Reads a pack's records in order from `from` up to `size`, checking each one whole against its CRCs. */
class RecordReader {
  readonly #fh: FileHandle;
  #pos: number;
  readonly #size: number;
  /** A checked header was read: from then on a header without a checksum is damage. */
  #checked: boolean;
  #buf = Buffer.allocUnsafe(64 * 1024);
  /** Bytes of `#buf` read, from file offset `#bufAt`. */
  #bufAt = 0;
  #bufLen = 0;

  constructor(fh: FileHandle, from: number, size: number, checked: boolean) {
    this.#fh = fh;
    this.#pos = from;
    this.#size = size;
    this.#checked = checked;
  }

  /**
   * The next record: valid, failed, or null at the end of the file or at one not whole (its
   * header line or its bytes running past the end, or still being streamed).
   */
  async next(): Promise<ValidRecord | FailedRecord | null> {
    const at = this.#pos;
    const line = await this.#line(at);
    if (line === null) return null;
    if (line === 'long') return { at, reason: 'record header line too long', next: null };
    const parsed = parseHeader(line.bytes, !this.#checked);
    if (typeof parsed === 'string') return { at, reason: parsed, next: null };
    const h = parsed.header;
    let end = line.end;
    if (!('d' in h)) {
      if (h.n < 0 || line.end + h.n > this.#size) return null;
      end = line.end + h.n;
      if (h.c !== ABANDONED && (await this.#crc(line.end, h.n)) !== h.c) return { at, reason: `an object's ${h.n} bytes fail their CRC-32`, next: end };
    }
    this.#pos = end;
    if (parsed.checked) this.#checked = true;
    return { header: h, offset: line.end, end, checked: parsed.checked };
  }

  /**
   * Moves past a failed record: after it if its header was valid, else to the next valid
   * header line (where its `{"k":` starts: the bytes before may not end in a newline); a
   * header start met on the way that fails too goes to `failing`. False: no valid one.
   */
  async skip(failed: FailedRecord, failing: (f: FailedRecord) => void): Promise<boolean> {
    if (failed.next !== null) {
      this.#pos = failed.next;
      return true;
    }
    for (let from = failed.at + 1; ; ) {
      const start = await this.#find(HEADER_START, from);
      if (start === null) return false;
      const line = await this.#line(start);
      if (line === null) return false;
      const parsed = line === 'long' ? 'record header line too long' : parseHeader(line.bytes, !this.#checked);
      if (typeof parsed !== 'string') {
        this.#pos = start;
        return true;
      }
      failing({ at: start, reason: parsed, next: null });
      from = start + 1;
    }
  }

  /** Reads again from `at`, from the file (not what was read before). */
  restart(at: number): void {
    this.#pos = at;
    this.#bufLen = 0;
  }

  async #crc(at: number, n: number): Promise<number> {
    let crc = 0;
    for (let pos = at; pos < at + n; ) {
      const part = await this.#bytes(pos, Math.min(this.#buf.byteLength, at + n - pos));
      crc = crc32(part, crc);
      pos += part.byteLength;
    }
    return crc;
  }

  /** Where `pattern` next occurs at or past `from`, or null if not before the end. */
  async #find(pattern: Buffer, from: number): Promise<number | null> {
    for (let pos = from; pos + pattern.byteLength <= this.#size; ) {
      const chunk = await this.#bytes(pos, Math.min(this.#buf.byteLength, this.#size - pos));
      const found = chunk.indexOf(pattern);
      if (found >= 0) return pos + found;
      // The pattern may straddle this chunk and the next.
      pos += Math.max(1, chunk.byteLength - pattern.byteLength + 1);
    }
    return null;
  }

  /** The line at `at` (its bytes without the newline, valid until the next read), null if it does not end before the file does, 'long' past `MAX_HEADER_BYTES`. */
  async #line(at: number): Promise<{ bytes: Buffer; end: number } | 'long' | null> {
    for (let want = 1024; ; want *= 2) {
      if (at >= this.#size) return null;
      const chunk = await this.#bytes(at, Math.min(want, this.#size - at));
      const nl = chunk.indexOf(0x0a);
      if (nl >= 0) return { bytes: chunk.subarray(0, nl), end: at + nl + 1 };
      if (at + chunk.byteLength >= this.#size) return null;
      if (want > MAX_HEADER_BYTES) return 'long';
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
