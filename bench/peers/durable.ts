/**
 * Peer 4, the durable conventional server (packages bench): the conventional peer's parse
 * and checks, then each accepted package's rows appended as NDJSON to one file and
 * fdatasync'ed before the 200 — what a straightforward service that stores every package
 * durably costs per package, to hold the service's per-package path against.
 */
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import type { EntitySpec } from '../../src/entities/catalog.js';
import { startPeer, success, type PeerReply } from './http-peer.js';
import { parseAndValidate } from './conventional.js';

const dir = process.argv[2];
if (!dir) throw new Error('durable peer: argv[2] must name a directory');
const log = await open(join(dir, 'packages.ndjson'), 'a');

async function ingest(entity: EntitySpec, body: Readable): Promise<PeerReply> {
  const checked = await parseAndValidate(entity, body);
  if (!('rows' in checked)) return checked;
  await log.appendFile(checked.rows.map((row) => `${JSON.stringify(row)}\n`).join(''));
  await log.datasync();
  return success(entity, checked.rows.length);
}

startPeer(ingest);
