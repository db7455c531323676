// The test oracle of rota's leasable rules: the instance a rule maps a ticket to over a list
// ordered by id, as docs/rules.md specifies them (round_robin `t mod n`; repeat(n=N)
// `(t / N) mod n`; weighted slot `t mod Σw` of the earliest-deadline-first schedule of the
// weights reduced by their gcd). The channel routes by the positions rota sends and holds no
// copy of the rules; the runners check rota's answers, and the channel's use of them, against
// this one.

/** The oracle's longest weighted schedule: the scenarios' weights stay far below rota's 2^20 slots, past which rota scales. */
const MAX_SLOTS = 1 << 16;

function gcd(a: number, b: number): number {
  while (b !== 0) {
    [a, b] = [b, a % b];
  }
  return a;
}

/** rota's weighted cycle: instance i's k-th slot is due at (2k+1)/2wᵢ, ties to the lower index. */
export function weightedCycle(weights: readonly number[]): number[] {
  const divisor = weights.filter((w) => w > 0).reduce(gcd, 0) || 1;
  const reduced = weights.map((w) => Math.floor(w / divisor));
  const total = reduced.reduce((a, b) => a + b, 0);
  if (total > MAX_SLOTS) {
    throw new Error(`oracle: ${total} weighted slots, more than the oracle builds`);
  }
  const slots: { numerator: number; weight: number; index: number }[] = [];
  reduced.forEach((weight, index) => {
    for (let k = 0; k < weight; k++) {
      slots.push({ numerator: 2 * k + 1, weight, index });
    }
  });
  slots.sort((a, b) => a.numerator * b.weight - b.numerator * a.weight || a.index - b.index);
  return slots.map((s) => s.index);
}

/** The position `rule` maps `ticket` to over `weights.length` instances (weights for weighted). */
export function oraclePosition(rule: string, weights: readonly number[], ticket: bigint): number {
  const n = BigInt(weights.length);
  if (rule === '' || rule === 'round_robin') {
    return Number(ticket % n);
  }
  const repeat = rule === 'repeat' ? ['', '3'] : /^repeat\(n=(\d+)\)$/.exec(rule);
  if (repeat !== null) {
    return Number((ticket / BigInt(repeat[1]!)) % n);
  }
  if (rule === 'weighted') {
    const cycle = weightedCycle(weights);
    return cycle[Number(ticket % BigInt(cycle.length))]!;
  }
  throw new Error(`oracle: no mapping for rule ${JSON.stringify(rule)}`);
}

/** The positions of tickets first .. first + count - 1, as a lease answer carries them. */
export function oraclePositions(rule: string, weights: readonly number[], first: bigint, count: number): number[] {
  if (rule === 'weighted') {
    const cycle = weightedCycle(weights);
    return Array.from({ length: count }, (_, i) => cycle[Number((first + BigInt(i)) % BigInt(cycle.length))]!);
  }
  return Array.from({ length: count }, (_, i) => oraclePosition(rule, weights, first + BigInt(i)));
}
