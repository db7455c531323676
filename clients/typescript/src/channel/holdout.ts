// Holding out an instance whose calls time out: a hung instance (a stopped process whose
// connections stay open, so its subchannel stays READY) would otherwise take every call its
// tickets map to until each one's deadline.

import { status } from '@grpc/grpc-js';

/** Calls in a row that ended DEADLINE_EXCEEDED before an instance is held out. */
export const HOLD_AFTER_TIMEOUTS = 3;
/** The first hold; each further run of timeouts doubles it, up to {@link MAX_HOLD_MS}. */
export const HOLD_MS = 10_000;
export const MAX_HOLD_MS = 60_000;

/**
 * One instance's timeout count and hold. A call records the {@link generation} it was sent in;
 * a hold starts a new generation, so the timeouts of calls sent before it (which end just
 * after it began) do not count towards the next, doubled, hold.
 */
export class HoldOut {
  #timeouts = 0;
  /** Holds since the instance last answered: the next one lasts HOLD_MS · 2^holds. */
  #holds = 0;
  /** When the current hold ends (clock time), or 0 when there is none. */
  #until = 0;
  #holdMs = 0;
  #generation = 0;

  constructor(readonly clock: () => number = () => performance.now()) {}

  /** False while held out. A hold that has run its time ends here: the call may try the instance. */
  usable(): boolean {
    if (this.#until === 0) {
      return true;
    }
    if (this.clock() < this.#until) {
      return false;
    }
    this.#until = 0;
    return true;
  }

  get generation(): number {
    return this.#generation;
  }

  /** The length of the current hold in ms, 0 when the instance is not held out. */
  get holdMs(): number {
    return this.#until !== 0 && this.clock() < this.#until ? this.#holdMs : 0;
  }

  /**
   * A call sent in `generation` ended with `code`. DEADLINE_EXCEEDED counts; a cancellation by
   * the caller and UNAVAILABLE (a connect failure) neither count nor reset; anything else is an
   * answer from the instance and resets the count and the doubling.
   */
  ended(generation: number, code: status): void {
    switch (code) {
      case status.DEADLINE_EXCEEDED:
        if (generation !== this.#generation) {
          return;
        }
        if (++this.#timeouts >= HOLD_AFTER_TIMEOUTS) {
          this.#holdMs = Math.min(HOLD_MS * 2 ** this.#holds, MAX_HOLD_MS);
          this.#holds++;
          this.#timeouts = 0;
          this.#generation++;
          // The clock does not go below 0, so #until > 0 ("no hold" is 0).
          this.#until = this.clock() + this.#holdMs;
        }
        return;
      case status.CANCELLED:
      case status.UNAVAILABLE:
        return;
      default:
        this.#timeouts = 0;
        this.#holds = 0;
    }
  }
}
