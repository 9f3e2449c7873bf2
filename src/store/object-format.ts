/**
 * The format of a stored object, one per package: a header line (`ObjectHeader`, JSON), then
 * the package's NDJSON lines as the queue holds them, one JSON array per row. Written by the
 * uploader (`objectBody`); its size is recorded with the package (`objectHeaderLine`) and its
 * rows counted back by whoever reads one (`countRows`).
 */
import type { CommittedPackage, PackageMeta } from './ports.js';

/** First line of every stored object; the rows follow, one JSON array per line. */
export interface ObjectHeader {
  entity: string;
  columns: string[];
  package_id: string;
  upload_uuid: string;
  client_id: string;
  rows: number;
}

/** The first line of a package's object; its size plus the rows' bytes is the object's size. */
export function objectHeaderLine(meta: PackageMeta, rows: number): Buffer {
  const { entity, columns, package_id, upload_uuid, client_id } = meta;
  const header: ObjectHeader = { entity, columns, package_id, upload_uuid, client_id, rows };
  return Buffer.from(`${JSON.stringify(header)}\n`);
}

/** A package's object: the header line, then the batches' bytes unchanged (`reuse`: see `CommittedPackage.batches`). */
export async function* objectBody(pkg: CommittedPackage, reuse: boolean): AsyncIterable<Uint8Array> {
  yield objectHeaderLine(pkg.meta, pkg.rows);
  yield* pkg.batches({ reuse });
}

/** Reads a stored object: its header and the number of non-empty row lines after it. */
export async function countRows(body: AsyncIterable<Uint8Array>): Promise<{ header: ObjectHeader; rows: number }> {
  const headChunks: Uint8Array[] = [];
  let header: ObjectHeader | undefined;
  let rows = 0;
  let lineHasContent = false;
  for await (const chunk of body) {
    let i = 0;
    if (!header) {
      const nl = chunk.indexOf(0x0a);
      if (nl < 0) {
        headChunks.push(chunk);
        continue;
      }
      headChunks.push(chunk.subarray(0, nl));
      header = JSON.parse(Buffer.concat(headChunks).toString('utf8')) as ObjectHeader;
      i = nl + 1;
    }
    for (; i < chunk.length; i++) {
      const b = chunk[i];
      if (b === 0x0a) {
        if (lineHasContent) rows++;
        lineHasContent = false;
      } else if (b !== 0x20 && b !== 0x09 && b !== 0x0d) {
        lineHasContent = true;
      }
    }
  }
  if (!header) {
    if (headChunks.length === 0) throw new Error('Object is empty: no header line');
    header = JSON.parse(Buffer.concat(headChunks).toString('utf8')) as ObjectHeader;
  }
  return { header, rows: rows + (lineHasContent ? 1 : 0) };
}
