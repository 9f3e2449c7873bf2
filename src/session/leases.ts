/**
 * The leases of the ingests running in this process, per session: while any is held, a
 * heartbeat every third of the lease renews them (`SessionService.renewLeases`).
 */
import type { ClientRef } from './state.js';

export class HeldLeases {
  /** Per session: the leases of the ingests running in this process. */
  private readonly held = new Map<string, { client: ClientRef; ids: Set<string> }>();
  /** Runs `renew` every third of the lease while this process holds any. */
  private heartbeat: NodeJS.Timeout | undefined;

  constructor(
    private readonly deps: { readonly inFlightLeaseMs: number },
    private readonly renew: () => void,
  ) {}

  /** The sessions with leases held here: the client and the package ids of each. */
  sessions(): [string, { client: ClientRef; ids: Set<string> }][] {
    return [...this.held];
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
