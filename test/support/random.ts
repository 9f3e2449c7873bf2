import { mulberry32 } from '../../testbed/random.js';

/** A seeded generator (mulberry32), so that a failing trial can be replayed. Returns an integer below `below` per call. */
export function seededRandom(seed: number): (below: number) => number {
  const next = mulberry32(seed);
  return (below) => Math.floor(next() * below);
}
