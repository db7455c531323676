// Maps leased tickets to instances exactly as rota's rules do (src/rules/round_robin.rs,
// repeat.rs, weighted.rs): round_robin `t mod n`, repeat(n=N) `(t / N) mod len`, weighted slot
// `t mod Σw` of an earliest-deadline-first schedule. Tickets are bigints: rota's counters are
// 64-bit.

/** Longest weighted schedule, as rota bounds it (2^20 slots). */
export const MAX_CYCLE = 1 << 20;

export type LeasedRule =
  | { readonly kind: 'round_robin' }
  | { readonly kind: 'repeat'; readonly n: bigint }
  | { readonly kind: 'weighted' };

/** Reads the canonical rule rota returns with a lease; throws for a rule it cannot map. */
export function parseLeasedRule(canonical: string): LeasedRule {
  if (canonical === 'round_robin') {
    return { kind: 'round_robin' };
  }
  if (canonical === 'weighted') {
    return { kind: 'weighted' };
  }
  if (canonical === 'repeat') {
    return { kind: 'repeat', n: 3n };
  }
  const match = /^repeat\(n=(\d+)\)$/.exec(canonical);
  if (match !== null && BigInt(match[1]!) > 0n && BigInt(match[1]!) <= 0xffffffffn) {
    return { kind: 'repeat', n: BigInt(match[1]!) };
  }
  throw new Error(`rota: rule ${JSON.stringify(canonical)} cannot be leased; use round_robin, repeat(n=N) or weighted`);
}

/**
 * Ticket → position in a lease's instance list (ordered by id). Excluded positions are skipped
 * the way rota skips a Pick's `exclude`: round_robin and repeat rotate over the accepted
 * positions, weighted walks on to the next slot of an accepted instance.
 */
export class TicketMap {
  readonly #rule: LeasedRule;
  readonly #size: number;
  readonly #slots: Uint32Array;

  constructor(rule: LeasedRule, weights: readonly number[]) {
    this.#rule = rule;
    this.#size = weights.length;
    this.#slots = rule.kind === 'weighted' ? weightSchedule(weights) : new Uint32Array(0);
  }

  /** The position for `ticket`, or undefined when every position is excluded. */
  position(ticket: bigint, excluded?: (position: number) => boolean): number | undefined {
    switch (this.#rule.kind) {
      case 'weighted': {
        const slots = this.#slots;
        if (slots.length === 0) {
          return undefined;
        }
        const start = Number(ticket % BigInt(slots.length));
        for (let step = 0; step < slots.length; step++) {
          const p = slots[(start + step) % slots.length]!;
          if (excluded === undefined || !excluded(p)) {
            return p;
          }
        }
        return undefined;
      }
      case 'repeat':
        return this.#rotate(ticket / this.#rule.n, excluded);
      default:
        return this.#rotate(ticket, excluded);
    }
  }

  #rotate(turn: bigint, excluded?: (position: number) => boolean): number | undefined {
    let accepted = this.#size;
    if (excluded !== undefined) {
      for (let p = 0; p < this.#size; p++) {
        if (excluded(p)) {
          accepted--;
        }
      }
    }
    if (accepted === 0) {
      return undefined;
    }
    let k = Number(turn % BigInt(accepted));
    for (let p = 0; p < this.#size; p++) {
      if (excluded !== undefined && excluded(p)) {
        continue;
      }
      if (k === 0) {
        return p;
      }
      k--;
    }
    return undefined;
  }
}

function gcd(a: number, b: number): number {
  while (b !== 0) {
    [a, b] = [b, a % b];
  }
  return a;
}

/** Weights reduced by their gcd, scaled down proportionally past MAX_CYCLE slots. */
export function normalizeWeights(weights: readonly number[]): number[] {
  const divisor = weights.filter((w) => w > 0).reduce(gcd, 0) || 1;
  const reduced = weights.map((w) => Math.floor(w / divisor));
  const total = reduced.reduce((a, b) => a + b, 0);
  if (total > MAX_CYCLE) {
    const nonzero = reduced.filter((w) => w > 0).length;
    const budget = Math.max(MAX_CYCLE - nonzero, 1);
    // Weights are u32, so w·budget < 2^52: exact in a double.
    return reduced.map((w) => (w > 0 ? 1 + Math.floor((w * budget) / total) : 0));
  }
  return reduced;
}

interface Slot {
  numerator: number;
  weight: number;
  index: number;
}

/** a's deadline (numerator / 2·weight) comes first, ties to the lower index. */
function before(a: Slot, b: Slot): boolean {
  // Cross-multiplied deadlines: after normalization weights are at most 2^20 and numerators
  // 2^21, so the products are exact in a double.
  const l = a.numerator * b.weight;
  const r = b.numerator * a.weight;
  return l !== r ? l < r : a.index < b.index;
}

/** rota's weighted cycle: instance i's k-th slot is due at (2k+1)/2wᵢ. */
export function weightSchedule(weights: readonly number[]): Uint32Array {
  const w = normalizeWeights(weights);
  const total = w.reduce((a, b) => a + b, 0);
  const heap: Slot[] = [];
  w.forEach((weight, index) => {
    if (weight > 0) {
      heap.push({ numerator: 1, weight, index });
    }
  });
  for (let i = (heap.length >> 1) - 1; i >= 0; i--) {
    siftDown(heap, i);
  }
  const slots = new Uint32Array(total);
  let n = 0;
  while (heap.length > 0) {
    const top = heap[0]!;
    slots[n++] = top.index;
    top.numerator += 2;
    if (top.numerator >= 2 * top.weight) {
      const last = heap.pop()!;
      if (heap.length > 0) {
        heap[0] = last;
      }
    }
    if (heap.length > 0) {
      siftDown(heap, 0);
    }
  }
  return slots;
}

function siftDown(heap: Slot[], i: number): void {
  for (;;) {
    const l = 2 * i + 1;
    const r = l + 1;
    let best = i;
    if (l < heap.length && before(heap[l]!, heap[best]!)) {
      best = l;
    }
    if (r < heap.length && before(heap[r]!, heap[best]!)) {
      best = r;
    }
    if (best === i) {
      return;
    }
    [heap[i], heap[best]] = [heap[best]!, heap[i]!];
    i = best;
  }
}
