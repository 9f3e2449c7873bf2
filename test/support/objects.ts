/** An object's bytes as text, or null when there is none. */
export async function readText(store: { get(key: string): Promise<AsyncIterable<Uint8Array> | null> }, key: string): Promise<string | null> {
  const body = await store.get(key);
  if (!body) return null;
  const parts: Buffer[] = [];
  for await (const chunk of body) parts.push(Buffer.from(chunk));
  return Buffer.concat(parts).toString();
}
