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
 *
 * {@link TicketMap.usable} maps a ticket whose instance the channel cannot use to one it can,
 * keeping the rule's shares among the usable ones (docs/channels.md, "Instances the channel
 * cannot use").
 */
export class TicketMap {
  readonly #rule: LeasedRule;
  readonly #size: number;
  readonly #slots: Uint32Array;
  /** Weighted: each position's slots in schedule order, built on the first call that needs it. */
  #bySlot: { starts: Uint32Array; slots: Uint32Array } | undefined;

  constructor(rule: LeasedRule, weights: readonly number[]) {
    this.#rule = rule;
    this.#size = weights.length;
    this.#slots = rule.kind === 'weighted' ? weightSchedule(weights) : new Uint32Array(0);
  }

  /**
   * The position for `ticket` when the positions `unusable` names cannot take calls: the
   * rule's own position when it is usable, else, with the rule's cycle of slots S (round_robin
   * and repeat: the positions; weighted: the slots of its schedule), the unit u (the ticket;
   * repeat(n=r): ⌊ticket / r⌋), j = ⌊u / |S|⌋, D the unusable slots of S in order, i the rank
   * of slot u mod |S| among them and A the usable slots in order: the position of slot
   * A[(j·|D| + i) mod |A|]. Over |A| cycles each usable slot takes |D| of the unusable slots'
   * tickets. Undefined when no position is usable. O(n) in the positions (weighted:
   * O(n·log²|S|)), and only when the rule's own position is unusable.
   */
  usable(ticket: bigint, unusable: (position: number) => boolean): number | undefined {
    if (this.#rule.kind === 'weighted') {
      return this.#usableSlot(ticket, unusable);
    }
    const n = this.#size;
    if (n === 0) {
      return undefined;
    }
    const unit = this.#rule.kind === 'repeat' ? ticket / this.#rule.n : ticket;
    const slot = Number(unit % BigInt(n));
    if (!unusable(slot)) {
      return slot;
    }
    let d = 0;
    let rank = 0;
    const usable: number[] = [];
    for (let p = 0; p < n; p++) {
      if (unusable(p)) {
        d++;
        if (p < slot) {
          rank++;
        }
      } else {
        usable.push(p);
      }
    }
    if (usable.length === 0) {
      return undefined;
    }
    return usable[spreadIndex(unit / BigInt(n), d, rank, usable.length)];
  }

  #usableSlot(ticket: bigint, unusable: (position: number) => boolean): number | undefined {
    const m = this.#slots.length;
    if (m === 0) {
      return undefined;
    }
    const slot = Number(ticket % BigInt(m));
    if (!unusable(this.#slots[slot]!)) {
      return this.#slots[slot];
    }
    const { starts, slots } = (this.#bySlot ??= slotsByPosition(this.#slots, this.#size));
    // Slots of position p before slot s: a binary search in p's (ascending) slots.
    const before = (p: number, s: number): number => {
      let lo = starts[p]!;
      let hi = starts[p + 1]!;
      const first = lo;
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        if (slots[mid]! < s) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      return lo - first;
    };
    let d = 0;
    let rank = 0;
    const usable: number[] = [];
    for (let p = 0; p < this.#size; p++) {
      const count = starts[p + 1]! - starts[p]!;
      if (count === 0) {
        continue;
      }
      if (unusable(p)) {
        d += count;
        rank += before(p, slot);
      } else {
        usable.push(p);
      }
    }
    if (usable.length === 0) {
      return undefined;
    }
    const k = spreadIndex(ticket / BigInt(m), d, rank, m - d);
    // The k-th usable slot: the first slot s with more than k usable slots up to and including it.
    let lo = 0;
    let hi = m - 1;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      let upTo = 0;
      for (const p of usable) {
        upTo += before(p, mid + 1);
      }
      if (upTo > k) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return this.#slots[lo];
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

/** (j·|D| + i) mod |A|, j the cycle number (64-bit, so in bigint). */
function spreadIndex(cycle: bigint, unusable: number, rank: number, usable: number): number {
  return Number((cycle * BigInt(unusable) + BigInt(rank)) % BigInt(usable));
}

/** The slots of a schedule grouped by position, ascending within each: position p's are slots[starts[p] .. starts[p+1]). */
function slotsByPosition(schedule: Uint32Array, size: number): { starts: Uint32Array; slots: Uint32Array } {
  const starts = new Uint32Array(size + 1);
  for (const p of schedule) {
    starts[p + 1] = starts[p + 1]! + 1;
  }
  for (let p = 0; p < size; p++) {
    starts[p + 1] = starts[p + 1]! + starts[p]!;
  }
  const next = starts.slice(0, size);
  const slots = new Uint32Array(schedule.length);
  schedule.forEach((p, s) => {
    slots[next[p]!] = s;
    next[p] = next[p]! + 1;
  });
  return { starts, slots };
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
