// Exponential backoff with full jitter, for reconnecting registrations and watches.

export interface BackoffOptions {
  /** Ceiling of the first delay, in milliseconds. Default 100. */
  initialMs?: number;
  /** Largest ceiling, in milliseconds. Default 10 000. */
  maxMs?: number;
  /** Growth of the ceiling per attempt. Default 2. */
  multiplier?: number;
  /** Source of uniform numbers in [0, 1). Default `Math.random`. */
  random?: () => number;
}

/**
 * Delays for successive attempts: attempt n waits a uniformly random time in
 * [0, min(maxMs, initialMs * multiplier^n)) ("full jitter"), so clients that lost rota at
 * the same moment do not come back in step.
 */
export class Backoff {
  readonly initialMs: number;
  readonly maxMs: number;
  readonly multiplier: number;
  readonly #random: () => number;
  #attempt = 0;

  constructor(options: BackoffOptions = {}) {
    this.initialMs = options.initialMs ?? 100;
    this.maxMs = options.maxMs ?? 10_000;
    this.multiplier = options.multiplier ?? 2;
    this.#random = options.random ?? Math.random;
    if (!(this.initialMs > 0)) {
      throw new RangeError(`initialMs must be positive, got ${this.initialMs}`);
    }
    if (!(this.maxMs >= this.initialMs)) {
      throw new RangeError(`maxMs must be at least initialMs, got ${this.maxMs}`);
    }
    if (!(this.multiplier >= 1)) {
      throw new RangeError(`multiplier must be at least 1, got ${this.multiplier}`);
    }
  }

  /** How many delays were handed out since the last reset. */
  get attempt(): number {
    return this.#attempt;
  }

  /** The upper bound of the delay of attempt `attempt` (0-based). */
  ceiling(attempt: number): number {
    return Math.min(this.maxMs, this.initialMs * this.multiplier ** attempt);
  }

  /** The delay before the next attempt, in milliseconds. */
  next(): number {
    const ceiling = this.ceiling(this.#attempt);
    this.#attempt += 1;
    const draw = Math.min(Math.max(this.#random(), 0), 1);
    return Math.min(Math.floor(draw * ceiling), Math.ceil(ceiling) - 1);
  }

  /** Starts over from the first delay; call it once an attempt succeeded. */
  reset(): void {
    this.#attempt = 0;
  }
}
