/** What every handler gets from the composition root, and the authentication step they share. */
import type { ValidationPool } from '../validation-pool/index.js';
import type { Client, ClientRegistry } from '../http/auth.js';
import type { Request } from '../http/server.js';
import type { IdempotentIngests } from '../session/idempotency.js';
import type { PackageIngest } from '../session/ingest.js';
import type { SessionService } from '../session/service.js';
import type { BatchQueue } from '../store/ports.js';

export interface ApiDeps {
  service: SessionService;
  clients: ClientRegistry;
  pool: ValidationPool;
  queue: BatchQueue;
  /** `Idempotency-Key` records of ingest (retries answered once, stored once). */
  idempotency: IdempotentIngests;
  /** The ingest use case. */
  ingest: PackageIngest;
  webhook: { secret: string; toleranceSeconds: number };
  clock: () => number;
}

/** The request's client, checked; also names it in the request's access log line. */
export function authenticate(deps: ApiDeps, req: Request): Client {
  const client = deps.clients.authenticate(req.headers.get('authorization'), req.headers.get('client-id'), req.clientAddress);
  req.context.clientId = client.id;
  return client;
}

export const json = (body: unknown, status = 200) => ({ status, body });
