/**
 * Orphans: batches of a package whose gateway died before commit or abort. Every instance
 * sweeps now and then: a `b` subject with no `c` subject whose newest batch is older than
 * `orphanAfterMs` (far beyond the longest request) is deleted up to that batch. Committed
 * packages never expire.
 */
import type { StreamMessages } from './messages.js';
import type { QueueSubjects } from './subjects.js';

/** Removes orphaned batches; returns how many packages it removed. Safe to run anywhere, any time. */
export async function sweepOrphans(messages: StreamMessages, subjects: QueueSubjects, orphanAfterMs: number, now: number): Promise<number> {
  const batches = await messages.subjects(subjects.batches);
  if (batches.size === 0) return 0;
  const commits = await messages.subjects(subjects.commits);
  let removed = 0;
  for (const subject of batches.keys()) {
    if (commits.has(subjects.commitOfBatch(subject))) continue;
    const last = await messages.lastOf(subject);
    if (!last || now - last.time.getTime() < orphanAfterMs) continue;
    // Up to the batch we looked at only: whatever came after it is not ours to judge.
    await messages.deleteMatching(subject, last.seq);
    removed++;
  }
  return removed;
}
