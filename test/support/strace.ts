/**
 * Faults injected into a running process with strace (`-e inject=`): the drills' way to make
 * real system calls fail. Needs strace and permission to ptrace the process (root, as CI runs).
 */
import { spawn } from 'node:child_process';
import type { Test } from 'tap';

export interface Strace {
  /** Detaches: the calls succeed again. */
  stop(): Promise<void>;
}

/**
 * Attaches strace with `args` (its `-e trace=`, `-e inject=`, `-P`…) to every thread of `pid`;
 * resolves once it says it has (`Process N attached with M threads`, printed after the last
 * thread), so no call after this is missed. Detached at the latest when `t` ends.
 */
export async function strace(t: Test, pid: number, args: string[]): Promise<Strace> {
  const child = spawn('strace', ['-f', '-o', '/dev/null', ...args, '-p', String(pid)], { stdio: ['ignore', 'ignore', 'pipe'] });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async () => {
    child.kill();
    await exited;
  };
  t.teardown(stop);
  await new Promise<void>((resolve, reject) => {
    let said = '';
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
      said += chunk;
      if (said.includes(`Process ${pid} attached`)) resolve();
    });
    void exited.then(() => reject(new Error(`strace could not attach: ${said}`)));
  });
  return { stop };
}
