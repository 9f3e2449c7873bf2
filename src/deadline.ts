/**
 * A promise's answer within a deadline: `op`, or `late()`'s error once `timeoutMs` passed
 * first (undefined: no deadline). `op` itself goes on; `onLate` gets what it brings after the
 * deadline (a file opened too late, to be closed). Its failure after the deadline is ignored.
 */
export function withDeadline<T>(op: Promise<T>, timeoutMs: number | undefined, late: () => Error, onLate?: (value: T) => void): Promise<T> {
  if (timeoutMs === undefined) return op;
  return new Promise<T>((resolve, reject) => {
    let expired = false;
    const timer = setTimeout(() => {
      expired = true;
      reject(late());
    }, timeoutMs);
    op.then(
      (value) => {
        clearTimeout(timer);
        if (expired) onLate?.(value);
        else resolve(value);
      },
      (err: unknown) => {
        clearTimeout(timer);
        reject(err);
      },
    );
  });
}
