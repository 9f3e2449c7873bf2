/**
 * What no consumer will ever take. Every instance sweeps now and then:
 * - Acknowledged leftovers: a commit message at or below the consumer's ack floor was acked.
 *   On a limits stream the bulk removal (remover.ts) takes it a moment later, unless the
 *   process that acked it died first; a work queue removes it at the ack, unless the server
 *   lost power between the two. Removed with its batches.
 * - Orphans: batches of a package whose gateway died before commit or abort: a `b` subject
 *   with no `c` subject whose newest batch is older than `orphanAfterMs` (far beyond the
 *   longest request) is deleted up to that batch. Committed packages never expire.
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

/** Removes commit messages at or below `ackFloor` (acknowledged) and their batches; returns how many. */
export async function sweepAcknowledged(messages: StreamMessages, subjects: QueueSubjects, ackFloor: number): Promise<number> {
  let removed = 0;
  for (let sm = await messages.get({ seq: 1, next_by_subj: subjects.commits }); sm && sm.seq <= ackFloor; sm = await messages.get({ seq: sm.seq + 1, next_by_subj: subjects.commits })) {
    // A package's batches come before its commit.
    await messages.deleteMatching(subjects.batchOfCommit(sm.subject), sm.seq);
    await messages.deleteSeqs([sm.seq]);
    removed++;
  }
  return removed;
}
