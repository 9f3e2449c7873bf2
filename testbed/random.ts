/**
 * mulberry32 (Tommy Ettinger, public domain): a small seeded generator for tests, drills and
 * the bench, so that a failing trial or a bench body can be made again from its seed.
 * Returns a float in [0, 1) per call.
 */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = Math.imul(a ^ (a >>> 15), 1 | a);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}
