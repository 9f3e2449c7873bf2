/**
 * State changes told to a parent process over its IPC channel: what the tests, which spawn
 * gateways and uploaders as processes of their own (testbed/processes.ts), wait on instead of
 * asking status again and again. A process started without an IPC channel (`process.send`
 * undefined: every production start) gets nothing from here and sends nothing.
 */

/** The message a parent gets after writes that may change a status answer. */
export const STATE_CHANGE = { event: 'state-change' } as const;

/**
 * A notifier for `AppOptions.onStateChange` (and the uploader process's writes) that sends
 * `STATE_CHANGE` to the parent; undefined without an IPC channel. A burst of writes sends one
 * message at the end of the event-loop turn, and at most one is in flight: writes meanwhile
 * send one more once it is out. It never waits on the parent nor throws: a send that fails (the
 * parent gone) is dropped, and so is every later one.
 */
export function parentNotifier(proc: Pick<NodeJS.Process, 'send' | 'connected'> = process): (() => void) | undefined {
  const send = proc.send?.bind(proc);
  if (!send) return undefined;
  let queued = false;
  let sending = false;
  let broken = false;
  const flush = () => {
    queued = false;
    if (broken || !proc.connected) return;
    sending = true;
    const sent = (err: Error | null) => {
      sending = false;
      if (err) broken = true;
      else if (queued) setImmediate(flush);
    };
    try {
      send(STATE_CHANGE, undefined, undefined, sent);
    } catch {
      sending = false;
      broken = true;
    }
  };
  return () => {
    if (queued || broken) return;
    queued = true;
    if (!sending) setImmediate(flush);
  };
}
