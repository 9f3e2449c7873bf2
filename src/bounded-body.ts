/** Reading an HTTP answer's body without trusting its size: the service's Connector client and the client library. */

const utf8 = new TextDecoder();

/**
 * The body as text, at most `limit` bytes; past it the body is destroyed (closing the
 * socket) and undefined returned. A BOM is dropped (JSON.parse would refuse it).
 */
export async function readBounded(body: AsyncIterable<Uint8Array>, limit: number): Promise<string | undefined> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.byteLength;
    if (size > limit) return undefined; // leaving the loop destroys the stream
    chunks.push(chunk);
  }
  return utf8.decode(Buffer.concat(chunks, size));
}
