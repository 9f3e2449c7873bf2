/**
 * A disk that can lose power: faultfs (`testbed/faultfs/faultfs.c`, a FUSE passthrough that
 * keeps what is written to a file in its own memory until the file is fsync'ed) mounted
 * over a backing directory. `powerCut()` kills the daemon and detaches the mount, so what
 * was not synced is gone; `remount()` shows what a host sees when it boots again; `freeze()`
 * stops it answering (a hung device) until `thaw()`.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { faultFsPath } from './prerequisites.js';

interface Teardown {
  teardown(fn: () => unknown): void;
}

export interface FaultFs {
  /** The mount point: what programs on the "host" read and write. */
  readonly dir: string;
  /** The backing directory: the disk's durable contents. */
  readonly backingDir: string;
  /**
   * SIGKILL of the daemon and a lazy unmount: every byte not fsync'ed is gone, and programs
   * still using the mount get errors. The signal is sent before this returns, so kills made
   * in the same tick (the processes on the host) land at the same instant.
   */
  powerCut(): Promise<void>;
  /** Mounts the backing directory at `dir` again, after `powerCut`: only synced data. */
  remount(): Promise<void>;
  /**
   * SIGSTOP of the daemon: every call on the mount that the page cache cannot answer waits
   * (a frozen or hung device) until `thaw` (SIGCONT). A cut or the teardown ends it too.
   */
  freeze(): void;
  thaw(): void;
}

const READY_TIMEOUT_MS = 10_000;

/**
 * Mounts faultfs over `backingDir` (which stays the caller's) at a fresh directory; the
 * teardown cuts the power, unmounts and removes the mount point.
 */
export async function mountFaultFs(t: Teardown, backingDir: string): Promise<FaultFs> {
  const bin = faultFsPath();
  const dir = await mkdtemp(join(tmpdir(), 'ingest-faultfs-'));
  let proc: ChildProcess | null = null;
  let exited: Promise<void> = Promise.resolve();

  const unmount = (): void => {
    // Lazy: detaches at once even while dead-connection descriptors are still open. Not mounted: an error, ignored.
    spawnSync('fusermount3', ['-u', '-z', dir], { stdio: 'ignore' });
  };
  const cut = (): Promise<void> => {
    const p = proc;
    if (!p) return Promise.resolve();
    p.kill('SIGKILL');
    return exited.then(unmount);
  };

  const mount = async (): Promise<void> => {
    if (proc) throw new Error(`faultfs at ${dir} is already mounted`);
    const child = spawn(bin, [backingDir, dir, '-o', 'fsname=faultfs,subtype=faultfs'], { stdio: ['ignore', 'pipe', 'pipe'] });
    proc = child;
    let out = '';
    // A test process that dies without its teardown (a tap timeout) leaves no mount behind.
    const orphaned = (): void => {
      child.kill('SIGKILL');
      unmount();
    };
    process.once('exit', orphaned);
    exited = new Promise((resolve) => child.once('exit', () => resolve()));
    void exited.then(() => {
      process.removeListener('exit', orphaned);
      if (proc === child) proc = null;
    });
    let timer: NodeJS.Timeout | undefined;
    const ready = await new Promise<boolean>((resolve) => {
      const keep = (chunk: Buffer): void => {
        out += chunk.toString('utf8');
        if (out.includes('faultfs: ready')) resolve(true);
      };
      child.stdout!.on('data', keep);
      child.stderr!.on('data', keep);
      void exited.then(() => resolve(false));
      timer = setTimeout(() => resolve(false), READY_TIMEOUT_MS);
    });
    clearTimeout(timer);
    if (!ready) {
      await cut();
      throw new Error(`faultfs did not mount ${backingDir} at ${dir}:\n${out}`);
    }
  };

  t.teardown(async () => {
    await cut();
    unmount();
    await rm(dir, { recursive: true, force: true });
  });
  await mount();

  return {
    dir,
    backingDir,
    powerCut: cut,
    async remount() {
      await removeHidden(backingDir);
      await mount();
    },
    freeze: () => void proc?.kill('SIGSTOP'),
    thaw: () => void proc?.kill('SIGCONT'),
  };
}

/**
 * Files unlinked while open live on as `.fuse_hidden*` until their last close; a cut leaves
 * them behind. A booting host's filesystem frees such orphans (ext4's orphan list): so do we.
 */
async function removeHidden(dir: string): Promise<void> {
  for (const entry of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (entry.name.startsWith('.fuse_hidden')) await rm(join(entry.parentPath, entry.name), { force: true });
  }
}
