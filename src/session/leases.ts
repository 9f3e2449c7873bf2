/**
 * The leases of the ingests running in this process, per session: while any is held, a
 * heartbeat every third of the lease renews them (`SessionService.renewLeases`). Spare
 * leases (state.ts `decideIngestRecord`) are held alike until an ingest takes one; a beat
 * ends those no ingest took since the beat before.
 */
import type { ClientRef } from './state.js';

export class HeldLeases {
  /** Per session: the leases of the ingests running in this process. */
  private readonly held = new Map<string, { client: ClientRef; ids: Set<string> }>();
  /** Per session: the spare leases not taken yet (each also in `held`). */
  private readonly spares = new Map<string, string[]>();
  /** Per session: spare leases being granted (their record writes under way). */
  private readonly granting = new Map<string, number>();
  /** The spare leases held at the last heartbeat: those still untaken at the next one end then. */
  private idle = new Set<string>();
  /** Runs `renew` every third of the lease while this process holds any. */
  private heartbeat: NodeJS.Timeout | undefined;

  constructor(
    private readonly deps: { readonly inFlightLeaseMs: number; readonly spareLeases: number },
    private readonly renew: () => void,
  ) {}

  /**
   * A heartbeat: per session with leases held here, its client, the leases to renew, and the
   * spare leases to end: those no ingest took since the last beat (taken off this process now).
   */
  beat(): { uploadUuid: string; client: ClientRef; ids: string[]; idle: string[] }[] {
    const idle = this.idle;
    this.idle = new Set([...this.spares.values()].flat());
    return [...this.held].map(([uploadUuid, { client, ids }]) => {
      const ended = (this.spares.get(uploadUuid) ?? []).filter((id) => idle.has(id));
      for (const id of ended) this.dropSpare(uploadUuid, id);
      return { uploadUuid, client, ids: [...ids].filter((id) => !idle.has(id)), idle: ended };
    });
  }

  /** An ingest began: its lease is renewed here from now on. */
  hold(client: ClientRef, uploadUuid: string, packageId: string): void {
    let session = this.held.get(uploadUuid);
    if (!session) {
      session = { client, ids: new Set() };
      this.held.set(uploadUuid, session);
    }
    session.ids.add(packageId);
    if (!this.heartbeat) {
      this.heartbeat = setInterval(this.renew, Math.max(1, Math.floor(this.deps.inFlightLeaseMs / 3)));
      this.heartbeat.unref();
    }
  }

  /** A spare lease for the session's next ingest here (the oldest), now that ingest's; undefined when none is held. */
  takeSpare(uploadUuid: string): string | undefined {
    const pool = this.spares.get(uploadUuid);
    const id = pool?.shift();
    if (pool?.length === 0) this.spares.delete(uploadUuid);
    return id;
  }

  /** Reserves the grant of a spare lease for the session: false at `spareLeases` held and being granted. */
  reserveSpare(uploadUuid: string): boolean {
    const granting = this.granting.get(uploadUuid) ?? 0;
    if ((this.spares.get(uploadUuid)?.length ?? 0) + granting >= this.deps.spareLeases) return false;
    this.granting.set(uploadUuid, granting + 1);
    return true;
  }

  /** A reserved grant's write ended: `granted`, the spare lease the summary now holds, is held until taken or ended. */
  settleSpare(client: ClientRef, uploadUuid: string, granted: string | null): void {
    const granting = (this.granting.get(uploadUuid) ?? 1) - 1;
    if (granting > 0) this.granting.set(uploadUuid, granting);
    else this.granting.delete(uploadUuid);
    if (granted === null) return;
    this.hold(client, uploadUuid, granted);
    const pool = this.spares.get(uploadUuid);
    if (pool) pool.push(granted);
    else this.spares.set(uploadUuid, [granted]);
  }

  /** Takes every spare lease of the session off this process (start-upload and delete end them). */
  dropSpares(uploadUuid: string): void {
    for (const id of [...(this.spares.get(uploadUuid) ?? [])]) this.dropSpare(uploadUuid, id);
  }

  private dropSpare(uploadUuid: string, id: string): void {
    const pool = this.spares.get(uploadUuid);
    if (!pool) return;
    const at = pool.indexOf(id);
    if (at < 0) return;
    pool.splice(at, 1);
    if (pool.length === 0) this.spares.delete(uploadUuid);
    this.unhold(uploadUuid, id);
  }

  /** The ingest ended (recorded, failed, abandoned): its lease is no longer renewed here. */
  unhold(uploadUuid: string, packageId: string): void {
    const session = this.held.get(uploadUuid);
    if (!session?.ids.delete(packageId)) return;
    if (session.ids.size === 0) this.held.delete(uploadUuid);
    if (this.held.size === 0) {
      clearInterval(this.heartbeat);
      this.heartbeat = undefined;
    }
  }
}
