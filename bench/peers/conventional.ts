/**
 * Peer 2, the conventional server: buffers the whole body (chunks kept in a list, joined
 * once), `JSON.parse`s it on the main thread and validates every row there, with the
 * service's own validators in the service's check order (UTF-8, JSON, structure, columns,
 * rows).
 */
import { isUtf8 } from 'node:buffer';
import type { Readable } from 'node:stream';
import { pathToFileURL } from 'node:url';
import type { EntitySpec } from '../../src/entities/catalog.js';
import { INVALID_JSON, bodyIssue, columnsError, compileRowCheck } from '../../src/entities/validators.js';
import { BodyTooLarge, isZlibError, startPeer, success, unprocessable, type PeerReply } from './http-peer.js';

/** The whole body parsed and every row checked: the rows, or the answer that refuses them. */
export async function parseAndValidate(entity: EntitySpec, body: Readable): Promise<{ rows: unknown[][] } | PeerReply> {
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of body as AsyncIterable<Buffer>) {
      chunks.push(chunk);
      size += chunk.byteLength;
    }
  } catch (err) {
    if (err instanceof BodyTooLarge) throw err;
    if (isZlibError(err)) return unprocessable(INVALID_JSON);
    throw err;
  }
  const bytes = Buffer.concat(chunks, size);
  if (!isUtf8(bytes)) return unprocessable(INVALID_JSON);
  const bom = bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf;
  let parsed: unknown;
  try {
    parsed = JSON.parse(bytes.toString('utf8', bom ? 3 : 0));
  } catch {
    return unprocessable(INVALID_JSON);
  }
  const issue = bodyIssue(parsed);
  if (issue) return unprocessable([issue]);
  const { columns, data } = parsed as { columns: string[]; data: unknown[][] };
  const columnsMessage = columnsError(entity, columns);
  if (columnsMessage) return unprocessable(columnsMessage);
  const check = compileRowCheck(entity, columns);
  for (let i = 0; i < data.length; i++) {
    const message = check(data[i]!, i);
    if (message) return unprocessable(message);
  }
  return { rows: data };
}

async function ingest(entity: EntitySpec, body: Readable): Promise<PeerReply> {
  const checked = await parseAndValidate(entity, body);
  return 'rows' in checked ? success(entity, checked.rows.length) : checked;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) startPeer(ingest);
