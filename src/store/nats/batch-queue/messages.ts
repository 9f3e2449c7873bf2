/** Message-level operations on the queue's stream, shared by the writer, the consumer and the sweeper. */
import type { MsgHdrs, MsgRequest, StoredMsg } from 'nats';
import { directGet, JS_NO_MESSAGE_FOUND, jsErrorCode, publishOnce, withRetry, type NatsContext } from '../connection.js';

/** "no message found" of a message delete. */
const JS_DELETE_FAILED = 10057;

export class StreamMessages {
  constructor(
    readonly ctx: NatsContext,
    readonly stream: string,
    /** How long one publish, read or delete keeps retrying through transient failures. */
    readonly retryMs: number,
  ) {}

  publish(subject: string, data: Uint8Array, msgID: string, hdrs?: () => MsgHdrs) {
    return publishOnce(this.ctx, subject, data, { msgID, stream: this.stream, budgetMs: this.retryMs, ...(hdrs ? { headers: hdrs } : {}) });
  }

  /** Removes every message on subjects matching `filter` (up to `upToSeq`): one filtered purge, safe to repeat. */
  async deleteMatching(filter: string, upToSeq?: number): Promise<void> {
    await withRetry(this.ctx, this.retryMs, () =>
      this.ctx.jsm.streams.purge(this.stream, upToSeq === undefined ? { filter } : { filter, seq: upToSeq + 1 }),
    );
  }

  /** Deletes these messages, a few requests at a time; one already gone is fine. */
  async deleteSeqs(seqs: number[]): Promise<void> {
    const left = [...seqs];
    const worker = async (): Promise<void> => {
      for (let seq = left.shift(); seq !== undefined; seq = left.shift()) {
        const s = seq;
        try {
          await withRetry(this.ctx, this.retryMs, () => this.ctx.jsm.streams.deleteMessage(this.stream, s, false));
        } catch (err) {
          if (jsErrorCode(err) !== JS_DELETE_FAILED) throw err;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(8, left.length) }, worker));
  }

  /** A stored message, or null when there is none (STREAM.MSG.GET, answered by the leader). */
  async get(query: { seq: number } | { last_by_subj: string } | { seq: number; next_by_subj: string }): Promise<StoredMsg | null> {
    try {
      // nats.js types `next_by_subj` for direct get only; the server takes it on STREAM.MSG.GET too.
      return await withRetry(this.ctx, this.retryMs, () => this.ctx.jsm.streams.getMessage(this.stream, query as MsgRequest));
    } catch (err) {
      if (jsErrorCode(err) === JS_NO_MESSAGE_FOUND) return null;
      throw err;
    }
  }

  /** As `get`, for answers only (status): any replica answers it (connection.ts `directGet`). */
  getForAnswer(query: { seq: number; next_by_subj: string }): Promise<{ seq: number } | null> {
    return directGet(this.ctx, this.stream, query, this.retryMs);
  }

  /** Message count per subject matching `filter`, from the stream's own state. */
  async subjects(filter: string): Promise<Map<string, number>> {
    const info = await withRetry(this.ctx, this.retryMs, () => this.ctx.jsm.streams.info(this.stream, { subjects_filter: filter }));
    return new Map(Object.entries(info.state.subjects ?? {}));
  }

  async lastOf(subject: string): Promise<{ seq: number; time: Date } | null> {
    const sm = await this.get({ last_by_subj: subject });
    return sm && { seq: sm.seq, time: sm.time };
  }
}
