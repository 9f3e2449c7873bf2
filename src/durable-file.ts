/**
 * Crash-safe file writes shared by every file-backed component: a reader (or the next
 * process after a crash) sees the old content or the new, never a torn file.
 */
import { randomBytes } from 'node:crypto';
import { mkdir, open, rename, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';

/** Makes a directory's entries (a rename, a new file) durable. */
export async function fsyncDir(dir: string): Promise<void> {
  const dh = await open(dir, 'r');
  try {
    await dh.sync();
  } finally {
    await dh.close();
  }
}

/**
 * Entries (a file or directory just made) whose directory's fsync failed: not durable yet, so
 * the next `fsyncEntry` of one syncs its directory again instead of taking it as durable.
 */
const unsynced = new Set<string>();

/**
 * Makes the entry of `path` in its directory durable when it was just `made`, or when an
 * earlier attempt for it failed (the file or directory is there, its entry may not be).
 */
export async function fsyncEntry(path: string, made: boolean): Promise<void> {
  if (!made && !unsynced.has(path)) return;
  unsynced.add(path);
  await fsyncDir(dirname(path));
  unsynced.delete(path);
}

/**
 * `mkdir -p` whose new entries are durable: the parent of every directory it made is fsynced,
 * so a power cut cannot take away a directory that files were then made in. One whose
 * parent's fsync failed is synced at the next call through it.
 */
export async function mkdirDurable(dir: string): Promise<void> {
  const created = await mkdir(dir, { recursive: true });
  if (created !== undefined) {
    for (let d = dir; ; d = dirname(d)) {
      unsynced.add(d);
      if (d === created) break;
    }
  }
  for (let d = dir; d !== dirname(d); d = dirname(d)) await fsyncEntry(d, false);
}

/**
 * Temp file (named `*.tmp`, in the same directory so the rename is atomic), fsync, rename
 * over `file`, fsync of the directory. The temp file is removed on failure.
 */
export async function writeFileAtomic(file: string, data: string | Uint8Array, opts: { mode?: number } = {}): Promise<void> {
  const dir = dirname(file);
  const tmp = join(dir, `.${basename(file)}.${randomBytes(6).toString('hex')}.tmp`);
  try {
    const fh = await open(tmp, 'wx', opts.mode ?? 0o644);
    try {
      await fh.writeFile(data);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, file);
  } catch (err) {
    await unlink(tmp).catch(() => undefined);
    throw err;
  }
  await fsyncDir(dir);
}
