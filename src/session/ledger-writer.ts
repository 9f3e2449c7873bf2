/**
 * Recorded packages to the ledger, in the background: per session, the packages recorded
 * within `lingerMs` of each other are written with one ledger append and then folded into the
 * summary together; a failed write is retried for about a minute (`retryInBackground`).
 */
import type { LedgerEntry, PackageLedger } from '../store/ports.js';
import type { PackageEntry } from './state.js';

/** Background retries (a lease release, a ledger write) back off up to this delay (about a minute in all). */
const RETRY_MAX_DELAY_MS = 32_000;

/** What the writer reads of the session service's dependencies (`SessionServiceDeps`), as it writes. */
export interface LedgerWriterDeps {
  readonly ledger: PackageLedger;
  /** How long recorded packages wait to be written together (default 10 ms). */
  readonly ledgerLingerMs?: number;
  readonly onBackgroundError?: (err: unknown, what: string) => void;
}

export class LedgerWriter {
  /** Per session: recorded packages waiting for their ledger write, and whether one is under way. */
  private readonly ledgerQueues = new Map<string, { waiting: PackageEntry[]; run: Promise<void> | null }>();

  constructor(
    private readonly deps: LedgerWriterDeps,
    /** Folds packages the ledger now holds into the session's summary. */
    private readonly fold: (uploadUuid: string, entries: readonly { id: string }[]) => Promise<void>,
  ) {}

  /** Writes recorded packages to the ledger, then folds them into the summary; per session, a group at a time. */
  write(uploadUuid: string, entries: PackageEntry[]): void {
    let queue = this.ledgerQueues.get(uploadUuid);
    if (!queue) {
      queue = { waiting: [], run: null };
      this.ledgerQueues.set(uploadUuid, queue);
    }
    queue.waiting.push(...entries);
    if (queue.run) return;
    const q = queue;
    const linger = this.deps.ledgerLingerMs ?? 10;
    q.run = (async () => {
      while (q.waiting.length > 0) {
        if (linger > 0) await new Promise((resolve) => setTimeout(resolve, linger));
        const group = q.waiting.splice(0);
        const write = async () => {
          await this.deps.ledger.append(uploadUuid, group.map(toLedger));
          await this.fold(uploadUuid, group);
        };
        await write().catch((err: unknown) => retryInBackground(write, err, 'write recorded packages to the ledger', (e, what) => this.deps.onBackgroundError?.(e, what)));
      }
      q.run = null;
      if (this.ledgerQueues.get(uploadUuid) === q) this.ledgerQueues.delete(uploadUuid);
    })();
  }

  /** Waits until every ledger write this process has queued so far is done (tests, shutdown). */
  async flush(): Promise<void> {
    for (const q of [...this.ledgerQueues.values()]) await q.run;
  }
}

/** Runs `fn` again after 500 ms, doubling up to `RETRY_MAX_DELAY_MS`, until it succeeds; past that the last error goes to `onError`. */
export async function retryInBackground(fn: () => Promise<unknown>, first: unknown, what: string, onError?: (err: unknown, what: string) => void): Promise<void> {
  let lastErr: unknown = first;
  for (let delay = 500; delay <= RETRY_MAX_DELAY_MS; delay *= 2) {
    await new Promise((r) => setTimeout(r, delay).unref());
    try {
      await fn();
      return;
    } catch (err) {
      lastErr = err;
    }
  }
  onError?.(lastErr, what);
}

export function toLedger(p: PackageEntry): LedgerEntry {
  return { package_id: p.id, entity: p.entity, rows: p.rows, bytes: p.bytes, object_bytes: p.object_bytes };
}

export function fromLedger(e: LedgerEntry): PackageEntry {
  return { id: e.package_id, entity: e.entity, rows: e.rows, bytes: e.bytes, object_bytes: e.object_bytes };
}
