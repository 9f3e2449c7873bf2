import { randomBytes } from 'node:crypto';
import { mkdir, open, readdir, rename, rm, rmdir, stat, unlink } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { ObjectStore, StoredObject } from '../ports.js';
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
  readonly consumesChunksInTurn = true;
  readonly #root: string;
  readonly #tmp: string;
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
      for (let tries = 0; ; tries++) {
        created ??= await mkdir(dirname(path), { recursive: true });
        try {
          await rename(tmp, path);
          break;
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || tries >= 3) throw err;
          created = undefined;
        }
      }
    } catch (err) {
      await unlink(tmp).catch(() => {});
      throw err;
    }
    // The new entry, and the entries of any directories made for it, must reach the disk.
    for (let d = dirname(path); ; d = dirname(d)) {
      await fsyncDir(d);
      if (!created || d === dirname(created) || d === this.#root) break;
    }
    return { key, size };
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
      await rmdir(d).catch(() => {});
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
  }

  #check(): void {
    if (this.#closed) throw new Error('Object store is closed');
  }

  #path(key: string): string {
    this.#check();
    const segments = key.split('/');
    if (segments.some((s) => s === '' || s === '.' || s === '..')) {
      throw new Error(`Invalid object key ${JSON.stringify(key)}: no empty, "." or ".." segments, no leading or trailing "/"`);
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
