import type { Dirent } from 'node:fs';
import { mkdir, open, readdir, rm, rmdir, stat, unlink } from 'node:fs/promises';
import { dirname, join } from 'node:path';
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

/** Pack files of a directory; no escaped segment starts with `~`, so they never meet a key's name. */
const DATA = '~data';
const INDEX = '~index';

/** An index line: an object of the directory at `o` in its data file, `n` bytes; or its removal. */
type IndexLine = { k: string; o: number; n: number } | { k: string; d: 1 };

interface Located {
  o: number;
  n: number;
}

/** A directory's index as read so far: every key's last entry, how far the file was read, and the reads in turn. */
interface DirIndex {
  entries: Map<string, Located>;
  readTo: number;
  reading: Promise<void>;
}

/** A directory's open pack: the data file, the index, and the put that streams alone, if any. */
interface Pack {
  data: AppendFile;
  index: AppendFile;
  /** A put too large to hold whole writes its chunks one after another: the others wait for it. */
  streaming: Promise<void> | null;
}

/**
 * `ObjectStore` on local files under `<dir>/objects/`, one directory per key segment (S3
 * lets `a/b` and `a/b/c` coexist, so every segment is escaped to `[a-z0-9._-]` plus `%xx`,
 * lower-case so that case-insensitive file systems keep `A` and `a` apart). The objects of
 * one directory (a session's packages of one entity) are packed: their bytes appended to the
 * directory's `~data` file, then one line `{k, o, n}` appended to its `~index` once the bytes
 * are durable; a key's last line wins, `{k, d: 1}` removes it. Both appends are group
 * committed (`AppendFile`): one fdatasync for every put of the directory that came
 * meanwhile, instead of a file, an fsync, a rename and a directory fsync per object — on the
 * build machine about 0.13 ms of CPU per 7 KB object instead of 1.1 ms. A reader sees an
 * object once its line is in the index, and its bytes were durable before: all or nothing.
 * A torn last index line (a crash mid-append) was never acknowledged and is skipped, and the
 * next line starts on a line of its own; bytes of a put that never got its line stay unused.
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
    // Held whole while it is small: chunks are copied, since the caller may reuse their memory.
    const held = new HeldBytes();
    const iterator = body[Symbol.asyncIterator]();
    let next = await iterator.next();
    while (!next.done && held.size + next.value.byteLength <= HOLD_BYTES) {
      held.add(next.value);
      next = await iterator.next();
    }
    let size = held.size;
    return this.#withPack(dir, async (pack) => {
      let offset: number;
      if (next.done) {
        while (pack.streaming) await pack.streaming;
        const { offset: at, written } = pack.data.write(held.bytes());
        offset = at;
        await written;
      } else {
        // Too large to hold: it streams alone, the directory's other puts wait.
        while (pack.streaming) await pack.streaming;
        let done!: () => void;
        pack.streaming = new Promise<void>((resolve) => (done = resolve));
        try {
          offset = pack.data.size;
          if (held.size > 0) await pack.data.write(held.bytes()).written;
          for (; !next.done; next = await iterator.next()) {
            await pack.data.write(next.value).written;
            size += next.value.byteLength;
          }
        } finally {
          pack.streaming = null;
          done();
        }
      }
      await pack.data.sync();
      await pack.index.append(Buffer.from(`${JSON.stringify({ k: key, o: offset, n: size } satisfies IndexLine)}\n`));
      return { key, size };
    });
  }

  async get(key: string): Promise<AsyncIterable<Uint8Array> | null> {
    const { dir, legacy } = this.#locate(key);
    const at = (await this.#index(dir)).entries.get(key);
    if (at) {
      if (at.n === 0) return (async function* () {})();
      // An open handle keeps reading the bytes even if the directory is removed meanwhile.
      return (await open(join(dir, DATA), 'r')).createReadStream({ start: at.o, end: at.o + at.n - 1 });
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
      if (!entries.some((e) => e.name === INDEX)) return;
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
      if (!entries.some((e) => e.name === INDEX)) return;
      const gone = [...(await this.#index(dir)).entries.keys()].filter((k) => k.startsWith(prefix));
      if (gone.length === 0) return;
      await this.#withPack(dir, (pack) => pack.index.append(Buffer.from(gone.map((k) => `${JSON.stringify({ k, d: 1 } satisfies IndexLine)}\n`).join(''))));
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

  /** Reads the index lines appended since the last read; a line still being written waits for the next. */
  async #readMore(dir: string, index: DirIndex): Promise<void> {
    let fh;
    try {
      fh = await open(join(dir, INDEX), 'r');
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
      const buf = Buffer.allocUnsafe(size - index.readTo);
      const { bytesRead } = await fh.read(buf, 0, buf.byteLength, index.readTo);
      const text = buf.subarray(0, bytesRead);
      const end = text.lastIndexOf(0x0a) + 1;
      const before = index.entries.size;
      for (const line of text.subarray(0, end).toString('utf8').split('\n')) {
        let entry: IndexLine;
        try {
          entry = JSON.parse(line) as IndexLine;
        } catch {
          continue; // empty, or torn by a crash: never acknowledged
        }
        if ('d' in entry) index.entries.delete(entry.k);
        else index.entries.set(entry.k, { o: entry.o, n: entry.n });
      }
      index.readTo += end;
      if (this.#indexes.get(dir) === index) {
        this.#indexed += index.entries.size - before;
        this.#evict(dir);
      }
    } finally {
      await fh.close();
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
        const data = await AppendFile.open(join(dir, DATA));
        let index: AppendFile;
        try {
          index = await AppendFile.openLines(join(dir, INDEX));
        } catch (err) {
          await data.close();
          throw err;
        }
        // The entries of the directories made for it must reach the disk (AppendFile made the files' own durable).
        if (created) {
          for (let d = dirname(dir); d.length >= dirname(created).length && d.startsWith(this.#root); d = dirname(d)) {
            await fsyncDir(d).catch(ignoreMissing);
            if (d === dirname(created) || d === this.#root) break;
          }
        }
        return { data, index, streaming: null };
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

/** Chunks copied into one buffer as they come (grown by doubling): one allocation for a small object, not one per chunk and a concatenation. */
class HeldBytes {
  #buf: Buffer | null = null;
  size = 0;

  add(chunk: Uint8Array): void {
    const need = this.size + chunk.byteLength;
    if (!this.#buf || need > this.#buf.byteLength) {
      const grown = Buffer.allocUnsafe(Math.max(need, Math.min(HOLD_BYTES, 2 * (this.#buf?.byteLength ?? 0))));
      this.#buf?.copy(grown, 0, 0, this.size);
      this.#buf = grown;
    }
    this.#buf.set(chunk, this.size);
    this.size = need;
  }

  bytes(): Buffer {
    return (this.#buf ?? Buffer.alloc(0)).subarray(0, this.size);
  }
}

async function closePack(pack: Pack): Promise<void> {
  await Promise.allSettled([pack.data.close(), pack.index.close()]);
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
