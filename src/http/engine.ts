/**
 * Which edge serves (`http.engine`): `uws` where the uWebSockets.js native binary loads,
 * `node` (`node:http`) everywhere else. The binary is loaded here directly, by the name the
 * package's own loader uses: that loader, when the binary does not load, prints a warning
 * and returns a slow pure-JS imitation, which the service never runs.
 */
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type { InternalErrorCode } from '../errors.js';
import { nodeEdge } from './node-edge.js';
import type { EdgeAdapter } from './types.js';
import type { UwsModule } from './uws-edge.js';

export type EngineChoice = 'auto' | 'uws' | 'node';

export interface LoadedEdge {
  adapter: EdgeAdapter;
  /** Why this edge runs, for the start-up log. */
  reason: string;
}

export class EdgeUnavailableError extends Error {
  override readonly name = 'EdgeUnavailableError';
  readonly code = 'HTTP_ENGINE_UNAVAILABLE' satisfies InternalErrorCode;
}

/** `abi`: the Node ABI whose uWS binary to load (this Node's; another only in tests). */
export async function loadEdge(choice: EngineChoice, abi = process.versions.modules): Promise<LoadedEdge> {
  if (choice === 'node') return { adapter: nodeEdge, reason: 'http.engine is node' };
  const uws = loadUws(abi);
  if ('module' in uws) {
    const { uwsEdge } = await import('./uws-edge.js');
    return { adapter: uwsEdge(uws.module), reason: `http.engine is ${choice} and ${uws.binary} loaded` };
  }
  if (choice === 'uws') {
    throw new EdgeUnavailableError(
      `http.engine is uws, but uWebSockets.js cannot load here: ${uws.why}. Set http.engine (HTTP_ENGINE) to node or auto.`,
    );
  }
  return { adapter: nodeEdge, reason: `http.engine is auto and uWebSockets.js cannot load here: ${uws.why}` };
}

/** True when `loadEdge('auto')` would choose uWS (its native binary loads on this Node). */
export function uwsLoads(): boolean {
  return 'module' in loadUws();
}

function loadUws(abi = process.versions.modules): { module: UwsModule; binary: string } | { why: string } {
  const require = createRequire(import.meta.url);
  const binary = `uws_${process.platform}_${process.arch}_${abi}.node`;
  let path: string;
  try {
    path = join(dirname(require.resolve('uWebSockets.js')), '..', 'binaries', binary);
  } catch {
    return { why: 'the uWebSockets.js package is not installed' };
  }
  try {
    return { module: require(path) as UwsModule, binary };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'MODULE_NOT_FOUND') {
      return { why: `no binary for Node ${process.versions.node} (ABI ${abi}) on ${process.platform}-${process.arch} in this build` };
    }
    return { why: `${binary} did not load (${firstLine((err as Error).message)})` };
  }
}

function firstLine(text: string): string {
  return text.split('\n')[0] ?? text;
}
