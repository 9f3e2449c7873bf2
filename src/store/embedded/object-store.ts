import { randomBytes } from 'node:crypto';
import { mkdir, open, readdir, rename, rm, rmdir, stat, unlink } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { StoreError, type ObjectStore, type StoredObject } from '../ports.js';
import { fsyncDir } from '../../durable-file.js';

/**
 * `ObjectStore` on local files under `<dir>/objects/`, one file per object, one directory per
 * key segment. S3 lets `a/b` and `a/b/c` coexist, a file system does not: every segment is
 * escaped to `[a-z0-9._-]` plus `%xx` (lower-case, so case-insensitive file systems keep
 * `A` and `a` apart) and object files end in `~`, which no escaped segment contains.
 * A put streams into `<dir>/tmp/`, fsyncs and renames, so readers see all or nothing.
 */
export class FileObjectStore implements ObjectStore {
  /** `put` writes each chunk out before it asks for the next. */
  readonly capabilities = { consumesChunksInTurn: true } as const;
  readonly #root: string;
  readonly #tmp: string;
  /** Per directory: its fsync under way, and the one the callers that came meanwhile share. */
  readonly #dirSyncs = new Map<string, { running: Promise<void>; next: Promise<void> | null }>();
  /** Directories known to exist (a put skips `mkdir` for them); bounded. */
  readonly #made = new Set<string>();
  #closed = false;

  private constructor(dir: string) {
    this.#root = join(dir, 'objects');
    this.#tmp = join(dir, 'tmp');
  }

  static async open(dir: string): Promise<FileObjectStore> {
    const store = new FileObjectStore(dir);
    await rm(store.#tmp, { recursive: true, force: true });
    await mkdir(store.#tmp, { recursive: true });
    await mkdir(store.#root, { recursive: true });
    return store;
  }

  async put(key: string, body: AsyncIterable<Uint8Array>): Promise<StoredObject> {
    const path = this.#path(key);
    const tmp = join(this.#tmp, randomBytes(12).toString('hex'));
    let size = 0;
    let created: string | undefined;
    try {
      const fh = await open(tmp, 'wx');
      try {
        for await (const chunk of body) {
          for (let off = 0; off < chunk.byteLength; ) off += (await fh.write(chunk, off)).bytesWritten;
          size += chunk.byteLength;
        }
        await fh.sync();
      } finally {
        await fh.close();
      }
      // A concurrent deletePrefix may remove the freshly made directory: make it again.
      const dir = dirname(path);
      for (let tries = 0; ; tries++) {
        if (!this.#made.has(dir)) {
          created ??= await mkdir(dir, { recursive: true });
          this.#remember(dir);
        }
        try {
          await rename(tmp, path);
          break;
        } catch (err) {
          this.#made.delete(dir);
          if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || tries >= 3) throw err;
          created = undefined;
        }
      }
    } catch (err) {
      await unlink(tmp).catch(() => {});
      throw err;
    }
    // The new entry, and the entries of any directories made for it, must reach the disk.
    // A directory gone meanwhile was removed by a deletePrefix that took the new object with
    // it (a session deleted while its package was uploaded): there is nothing left to sync.
    for (let d = dirname(path); ; d = dirname(d)) {
      const gone = await this.#syncDir(d).then(
        () => false,
        (err: NodeJS.ErrnoException) => {
          if (err.code === 'ENOENT') return true;
          throw err;
        },
      );
      if (gone || !created || d === dirname(created) || d === this.#root) break;
    }
    return { key, size };
  }

  /**
   * fsync of a directory, shared: puts into one directory (a session's packages of one
   * entity) that finish while its fsync runs share the next one instead of each making its own.
   */
  #syncDir(dir: string): Promise<void> {
    const current = this.#dirSyncs.get(dir);
    if (current) return (current.next ??= current.running.then(() => this.#startDirSync(dir), () => this.#startDirSync(dir)));
    return this.#startDirSync(dir);
  }

  #startDirSync(dir: string): Promise<void> {
    const running = fsyncDir(dir);
    const entry = { running, next: null as Promise<void> | null };
    this.#dirSyncs.set(dir, entry);
    void running.then(
      () => this.#dirSyncDone(dir, entry),
      () => this.#dirSyncDone(dir, entry),
    );
    return running;
  }

  #dirSyncDone(dir: string, entry: { next: Promise<void> | null }): void {
    // A queued sync, when there is one, replaces this entry as it starts.
    if (this.#dirSyncs.get(dir) === entry && entry.next === null) this.#dirSyncs.delete(dir);
  }

  #remember(dir: string): void {
    if (this.#made.size >= 10_000) this.#made.clear();
    this.#made.add(dir);
  }

  async get(key: string): Promise<AsyncIterable<Uint8Array> | null> {
    const path = this.#path(key);
    try {
      // An open handle keeps reading the old file even if a put replaces it meanwhile.
      return (await open(path, 'r')).createReadStream();
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
      throw err;
    }
  }

  async list(prefix: string): Promise<StoredObject[]> {
    this.#check();
    const start = this.#prefixDir(prefix);
    if (start === null) return [];
    const found: StoredObject[] = [];
    const walk = async (dir: string, keyDir: string): Promise<void> => {
      let entries;
      try {
        entries = await readdir(dir, { withFileTypes: true });
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
        throw err;
      }
      for (const e of entries) {
        if (e.isDirectory()) {
          const sub = keyDir + unescapeSegment(e.name) + '/';
          if (sub.startsWith(prefix) || prefix.startsWith(sub)) await walk(join(dir, e.name), sub);
        } else if (e.name.endsWith('~')) {
          const key = keyDir + unescapeSegment(e.name.slice(0, -1));
          if (!key.startsWith(prefix)) continue;
          try {
            found.push({ key, size: (await stat(join(dir, e.name))).size });
          } catch (err) {
            if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
          }
        }
      }
    };
    await walk(start.dir, start.keyDir);
    // S3 lists in UTF-8 byte order.
    return found.sort((a, b) => Buffer.compare(Buffer.from(a.key), Buffer.from(b.key)));
  }

  async deletePrefix(prefix: string): Promise<void> {
    const objects = await this.list(prefix);
    const dirs = new Set<string>();
    for (const { key } of objects) {
      const path = this.#path(key);
      await unlink(path).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== 'ENOENT') throw err;
      });
      for (let d = dirname(path); d !== this.#root; d = dirname(d)) dirs.add(d);
    }
    // Deepest first; a directory still holding other objects stays.
    for (const d of [...dirs].sort((a, b) => b.length - a.length)) {
      this.#made.delete(d);
      await rmdir(d).catch(() => {});
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
  }

  #check(): void {
    if (this.#closed) throw new StoreError('STORE_CLOSED', 'Object store is closed');
  }

  #path(key: string): string {
    this.#check();
    const segments = key.split('/');
    if (segments.some((s) => s === '' || s === '.' || s === '..')) {
      throw new StoreError('STORE_INVALID_KEY', `Invalid object key ${JSON.stringify(key)}: no empty, "." or ".." segments, no leading or trailing "/"`);
    }
    const last = segments.pop() as string;
    return join(this.#root, ...segments.map(escapeSegment), `${escapeSegment(last)}~`);
  }

  /** The deepest directory every key with `prefix` lives under, or null when no valid key can match. */
  #prefixDir(prefix: string): { dir: string; keyDir: string } | null {
    const complete = prefix.split('/').slice(0, -1);
    if (complete.some((s) => s === '' || s === '.' || s === '..')) return null;
    return {
      dir: join(this.#root, ...complete.map(escapeSegment)),
      keyDir: complete.map((s) => `${s}/`).join(''),
    };
  }
}

function escapeSegment(segment: string): string {
  let out = '';
  for (const byte of Buffer.from(segment, 'utf8')) {
    const c = String.fromCharCode(byte);
    out += /[a-z0-9._-]/.test(c) ? c : `%${byte.toString(16).padStart(2, '0')}`;
  }
  return out;
}

function unescapeSegment(name: string): string {
  return Buffer.from(name.replace(/%([0-9a-f]{2})/g, (_, h: string) => String.fromCharCode(parseInt(h, 16))), 'latin1').toString('utf8');
}
