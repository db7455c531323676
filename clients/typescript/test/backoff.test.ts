import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Backoff } from '../src/index.js';

/** A small seeded generator (mulberry32), so jitter tests are repeatable. */
function seeded(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe('Backoff', () => {
  it('grows the ceiling from 100 ms, doubling, up to the 10 s cap', () => {
    const backoff = new Backoff();
    const ceilings = Array.from({ length: 10 }, (_, attempt) => backoff.ceiling(attempt));
    assert.deepEqual(ceilings, [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]);
    assert.equal(backoff.ceiling(10_000), 10_000);
  });

  it('draws each delay uniformly below the ceiling (full jitter)', () => {
    const half = new Backoff({ random: () => 0.5 });
    assert.deepEqual(
      Array.from({ length: 9 }, () => half.next()),
      [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000],
    );
    const zero = new Backoff({ random: () => 0 });
    assert.deepEqual(
      Array.from({ length: 4 }, () => zero.next()),
      [0, 0, 0, 0],
    );
    const top = new Backoff({ random: () => 0.9999999 });
    assert.deepEqual(
      Array.from({ length: 9 }, () => top.next()),
      [99, 199, 399, 799, 1599, 3199, 6399, 9999, 9999],
    );
  });

  it('keeps seeded delays in [0, ceiling) and spreads them over the range', () => {
    const random = seeded(42);
    for (let attempt = 0; attempt < 9; attempt += 1) {
      const ceiling = Math.min(10_000, 100 * 2 ** attempt);
      const delays: number[] = [];
      for (let i = 0; i < 500; i += 1) {
        const backoff = new Backoff({ random });
        for (let skip = 0; skip < attempt; skip += 1) {
          backoff.next();
        }
        delays.push(backoff.next());
      }
      assert.ok(delays.every((d) => Number.isInteger(d) && d >= 0 && d < ceiling), `attempt ${attempt}: out of range`);
      assert.ok(Math.min(...delays) < ceiling * 0.05, `attempt ${attempt}: no short delay`);
      assert.ok(Math.max(...delays) > ceiling * 0.95, `attempt ${attempt}: no long delay`);
      const mean = delays.reduce((a, b) => a + b, 0) / delays.length;
      assert.ok(Math.abs(mean - ceiling / 2) < ceiling * 0.06, `attempt ${attempt}: mean ${mean} far from ${ceiling / 2}`);
    }
  });

  it('is repeatable with the same seed', () => {
    const a = new Backoff({ random: seeded(7) });
    const b = new Backoff({ random: seeded(7) });
    const first = Array.from({ length: 12 }, () => a.next());
    assert.deepEqual(
      Array.from({ length: 12 }, () => b.next()),
      first,
    );
  });

  it('starts over after reset()', () => {
    const backoff = new Backoff({ random: () => 0.5 });
    backoff.next();
    backoff.next();
    backoff.next();
    assert.equal(backoff.attempt, 3);
    backoff.reset();
    assert.equal(backoff.attempt, 0);
    assert.equal(backoff.next(), 50);
  });

  it('honours custom bounds and rejects impossible ones', () => {
    const backoff = new Backoff({ initialMs: 10, maxMs: 35, multiplier: 3, random: () => 0.5 });
    assert.deepEqual(
      Array.from({ length: 4 }, () => backoff.next()),
      [5, 15, 17, 17],
    );
    assert.throws(() => new Backoff({ initialMs: 0 }), RangeError);
    assert.throws(() => new Backoff({ initialMs: 100, maxMs: 50 }), RangeError);
    assert.throws(() => new Backoff({ multiplier: 0.5 }), RangeError);
  });
});
