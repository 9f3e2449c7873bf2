import type { Dirent } from 'node:fs';
import { open, readdir, rm, rmdir, stat, unlink, type FileHandle } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { crc32 } from 'node:zlib';
import type { InternalErrorCode } from '../../errors.js';
import { StoreError, type ObjectStore, type StoredObject } from '../ports.js';
import { mkdirDurable } from '../../durable-file.js';
import { AppendFile } from './append-file.js';
import type { OnDamage } from './damage.js';
import { OpenHandles } from './open-handles.js';
import { HeldBytes, HOLD_BYTES } from './object-store/held-bytes.js';
import { PACK, PackIndexes, type DirIndex, type Located } from './object-store/indexes.js';
import { escapeSegment, legacyFile, legacyKey, unescapeSegment } from './object-store/names.js';
import { ABANDONED, deletion, header } from './object-store/record.js';

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
 *
 * Its parts, in `object-store/`: `record.ts` (the header lines), `reader.ts` (a pack's records
 * read and checked in order), `indexes.ts` (what the packs hold, kept in memory, cut back and
 * damage reported), `held-bytes.ts` (a small object held whole), `names.ts` (keys as file
 * names, and the files of the one-file-per-object layout).
 */
export class FileObjectStore implements ObjectStore {
  /** `put` writes each chunk out (or copies it) before it asks for the next. */
  readonly capabilities = { consumesChunksInTurn: true } as const;
  readonly #root: string;
  /** Open packs per directory. */
  readonly #packs: OpenHandles<Pack>;
  /** What the packs read so far hold, per directory. */
  readonly #indexes: PackIndexes;
  #closed = false;

  private constructor(dir: string, opts: FileObjectStoreOptions) {
    this.#root = join(dir, 'objects');
    this.#packs = new OpenHandles({ max: opts.maxOpenPacks ?? 64, open: (d) => this.#openPack(d), close: closePack });
    this.#indexes = new PackIndexes(opts.maxIndexedObjects ?? 500_000, opts.onDamage);
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
    return this.#indexes.damaged;
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
        this.#indexes.learn(dir, key, offset, record.byteLength - held.size, held.size, crc);
        return { key, size: held.size };
      });
    }
    // Too large to hold: it streams alone, the directory's other puts wait. A failure of the
    // body ends the put, not the pack: the pack is cut back to where the record began, so a
    // failed put leaves none of its bytes, and the pack goes on.
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
        try {
          if (held.size > 0) await add(held.bytes());
          for (; !next.done; next = await iterator.next()) await add(next.value);
        } catch (err) {
          // Made durable by the pack's next sync; a crash before it leaves a tail still streaming (n -1), cut off at the next open.
          await pack.file.truncate(at);
          return { err };
        }
        const head = header(key, size, crc);
        await pack.file.writeAt(head, at);
        await pack.file.sync();
        this.#indexes.learn(dir, key, at, head.byteLength, size, crc);
        return { key, size };
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
    const at = (await this.#indexes.index(dir)).entries.get(key);
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
        const key = legacyKey(e, keyDir);
        if (key === null || !key.startsWith(prefix)) continue;
        try {
          found.set(key, (await stat(join(dir, e.name))).size);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
        }
      }
      if (!entries.some((e) => e.name === PACK)) return;
      for (const [key, at] of (await this.#indexes.index(dir)).entries) if (key.startsWith(prefix)) found.set(key, at.n);
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
        if (legacyKey(e, keyDir)?.startsWith(prefix)) {
          await unlink(join(dir, e.name)).catch(ignoreMissing);
        }
      }
      if (!entries.some((e) => e.name === PACK)) return;
      const gone = (index: DirIndex) => [...index.entries.keys()].filter((k) => k.startsWith(prefix));
      if (gone(await this.#indexes.index(dir)).length === 0) return;
      // A delete of the directory whole may remove it meanwhile: the pack is not made again
      // for a deletion (it would be a pack holding nothing else), and only what it still holds goes.
      await this.#withPack(
        dir,
        async (pack) => {
          while (pack.streaming) await pack.streaming;
          const still = gone(await this.#indexes.index(dir));
          if (still.length > 0) await pack.file.append(Buffer.concat(still.map((k) => deletion(k))));
        },
        { make: false },
      ).catch((err: unknown) => {
        if (!(err instanceof PackMissing)) throw err;
      });
    });
    for (const dir of whole) {
      // Puts still writing into a pack of what goes finish there (the delete took their objects); later ones make a new one.
      this.#packs.retire((d) => d === dir || d.startsWith(`${dir}/`));
      for (const d of this.#indexes.dirs().filter((d) => d === dir || d.startsWith(`${dir}/`))) this.#indexes.forget(d);
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
        this.#indexes.reportDamage(path, at.o, `an object's ${at.n} bytes fail their CRC-32 when read`);
        throw new StoreError('STORE_CORRUPT', `${path}: the object at ${at.o} is damaged (its bytes fail their CRC-32)`);
      }
      if (held) yield held;
    } finally {
      await fh.close();
    }
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

  /**
   * Runs `fn` with the directory's pack; a failure retires it: the next put opens it afresh.
   * After a failed write or fdatasync the pack's tail is unknown (an fdatasync that failed may
   * leave the page cache holding bytes the disk does not): once no write of it is in flight,
   * the pack is marked to be cut back to its last durable byte before anyone reads or
   * appends to it again (`PackIndexes.index` does it).
   */
  #withPack<R>(dir: string, fn: (pack: Pack) => Promise<R>, opts: { make?: boolean } = {}): Promise<R> {
    this.#check();
    const make = opts.make ?? true;
    const use = async (pack: Pack): Promise<R> => {
      try {
        return await fn(pack);
      } catch (err) {
        if (pack.file.failed) {
          await pack.file.settled();
          this.#indexes.cutBackTo(dir, pack.file.durableSize);
        }
        throw err;
      }
    };
    if (!make) return this.#packs.use(dir, use, (d) => this.#openPack(d, false));
    return this.#packs.use(dir, use).catch((err: unknown) => {
      // It came while a delete found no pack to open, and shared that open: this one makes it.
      if (err instanceof PackMissing) return this.#withPack(dir, fn);
      throw err;
    });
  }

  /**
   * Opens (making them, and the directories above, durable when new) a directory's pack. A
   * concurrent deletePrefix may remove a freshly made directory: it is made again. Told not
   * to make it, a missing pack (or directory) fails with `PackMissing`.
   */
  async #openPack(dir: string, make = true): Promise<Pack> {
    for (let tries = 0; ; tries++) {
      try {
        if (make) await mkdirDurable(dir);
        // Appends go after the last valid record: a torn one (a crash mid-put) is cut off.
        const { readTo } = await this.#indexes.index(dir);
        const file = await AppendFile.open(join(dir, PACK), { size: readTo, create: make });
        return { file, streaming: null };
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
        if (!make) throw new PackMissing(dir);
        if (tries >= 3) throw err;
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
    return { dir, legacy: legacyFile(dir, last) };
  }
}

/** A directory with no pack to open, where the caller would not make one (a delete: nothing to delete there). Never leaves the store. */
class PackMissing extends Error {
  readonly code = 'PACK_MISSING' satisfies InternalErrorCode;
  constructor(dir: string) {
    super(`${dir}: no ${PACK}`);
  }
}

async function closePack(pack: Pack): Promise<void> {
  await pack.file.close();
}

/** Bytes `get` reads at a time. */
const READ_CHUNK = 1024 * 1024;

function ignoreMissing(err: NodeJS.ErrnoException): void {
  if (err.code !== 'ENOENT') throw err;
}
