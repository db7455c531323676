// Ticket leases, one stream per version in use: a block of consecutive tickets of rota's
// rotation, each with the position rota mapped it to, handed out one call at a time, the next
// block leased before this one runs out. A lease rota mapped itself (a service under gray
// release, leased without a version) is a block of picks instead: each names its instance and
// its ticket, and is handed out the same way. Every lease names in `exclude` the instances the
// channel cannot use, so that rota maps its tickets over the others.

import { Metadata, status, type ServiceError } from '@grpc/grpc-js';

import { Backoff } from '../backoff.js';
import type { LeaseResponse__Output } from '../generated/rota/v1/LeaseResponse.js';
import type { RotaLink } from './link.js';

/** Lease calls made by every channel of this process (read by the channel benchmark). */
export const leaseCalls = { count: 0 };

/** Bounds of the tickets of one lease (rota accepts at most 65,536). */
export const MIN_LEASE = 1;
export const MAX_LEASE = 65_536;
/** One lease should last about this long at the measured call rate. */
export const LEASE_TARGET_MS = 75;
/** Versions with a lease stream of their own; the least recently used one is dropped. */
export const MAX_VERSIONS = 32;
/** At most this many ids go in a lease's `exclude` (rota's bound): the first in id order. */
export const MAX_EXCLUDE = 1_000;
const INITIAL_LEASE = 16;
const LEASE_TIMEOUT_MS = 3_000;
/** How long a refusal by rota (no eligible instance, ...) answers calls before a new attempt. */
const REFUSAL_MS = 500;

/** One lease's instance list (ordered by id) and rule. */
export interface LeaseView {
  readonly rule: string;
  readonly ids: readonly string[];
  readonly addrs: readonly string[];
}

/** One pick of a lease rota mapped itself: the ticket to report and the position in the view. */
export interface LeasedPick {
  readonly ticket: bigint;
  readonly position: number;
}

/** The picks of one lease, and the positions they name (each once). */
export interface LeasedPicks {
  readonly list: readonly LeasedPick[];
  readonly named: readonly number[];
}

export function sameView(a: LeaseView | undefined, b: LeaseView): boolean {
  return a !== undefined && a.rule === b.rule && a.ids.length === b.ids.length && a.ids.every((id, i) => id === b.ids[i] && a.addrs[i] === b.addrs[i]);
}

export function hostPort(host: string, port: number): string {
  return host.includes(':') && !host.startsWith('[') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** The view of a lease answer: its rule, whatever rule rota leased, and its instances. */
export function viewOf(response: LeaseResponse__Output): LeaseView {
  return {
    rule: response.rule,
    ids: response.instances.map((i) => i.id),
    addrs: response.instances.map((i) => hostPort(i.host, i.port)),
  };
}

/**
 * The positions of a ticket-range answer (ticket `first_ticket + i` goes to
 * `instances[positions[i]]`); throws when they are not one per ticket, each naming an instance
 * of the answer.
 */
export function positionsOf(response: LeaseResponse__Output): readonly number[] {
  const positions = response.positions;
  if (positions.length !== response.count) {
    throw new Error(`rota: lease of ${response.count} tickets carries ${positions.length} positions, not one per ticket`);
  }
  const n = response.instances.length;
  for (let i = 0; i < positions.length; i++) {
    if (!(positions[i]! < n)) {
      throw new Error(`rota: lease position ${i} names position ${positions[i]} of ${n} instances`);
    }
  }
  return positions;
}

/**
 * The picks of a lease answer, or undefined for a ticket range; throws for a pick naming no
 * instance of the answer.
 */
export function picksOf(response: LeaseResponse__Output): LeasedPicks | undefined {
  if (response.picks.length === 0) {
    return undefined;
  }
  const list = response.picks.map((p, i) => {
    if (p.position >= response.instances.length) {
      throw new Error(`rota: lease pick ${i} names position ${p.position} of ${response.instances.length} instances`);
    }
    return { ticket: BigInt(p.ticket), position: p.position };
  });
  return { list, named: [...new Set(list.map((p) => p.position))] };
}

interface Block {
  first: bigint;
  count: number;
  used: number;
  view: LeaseView;
  /** A ticket range: ticket first + i goes to view.ids[positions[i]]. */
  positions: readonly number[];
  /** Set for a lease rota mapped itself: the i-th call takes picks.list[i]. */
  picks: LeasedPicks | undefined;
}

/**
 * One ticket for one call; `local` when it came from the local rotation. `position` names the
 * call's instance, `view.ids[position]`: rota's position for a leased ticket, a pick's own (of a
 * gray lease, or its local replay). It is unset only for a ticket of the local rotation over a
 * ticket range, which the picker turns over the view's usable instances in id order. `named`
 * lists the positions a block of picks names (each once).
 */
export interface Draw {
  ticket: bigint;
  view: LeaseView;
  local: boolean;
  position?: number;
  named?: readonly number[];
}

export type Take = { kind: 'ticket'; draw: Draw } | { kind: 'wait' } | { kind: 'error'; code: status; details: string };

/** The lease streams of one channel. */
export class Leaser {
  readonly #streams = new Map<string, VersionStream>();
  #generation = 0;
  #closed = false;
  readonly #stopWatching: () => void;

  constructor(
    readonly link: RotaLink,
    readonly rule: string,
    /** Republishes the picker, so that queued calls are picked again. */
    readonly wake: () => void,
    /** The view to rotate over when rota was never reached for a version. */
    readonly localView: (version: string) => LeaseView | undefined,
    /** The ids of the instances the channel cannot use now (not READY, or held out), in id order. */
    readonly unusable: () => readonly string[] = () => [],
  ) {
    this.#stopWatching = link.onWatchLost(() => this.invalidate());
  }

  get generation(): number {
    return this.#generation;
  }

  get closed(): boolean {
    return this.#closed;
  }

  stream(version: string): VersionStream {
    let s = this.#streams.get(version);
    if (s === undefined) {
      if (this.#streams.size >= MAX_VERSIONS) {
        let oldest: VersionStream | undefined;
        for (const c of this.#streams.values()) {
          if (oldest === undefined || c.lastUse < oldest.lastUse) {
            oldest = c;
          }
        }
        this.#streams.delete(oldest!.version);
      }
      s = new VersionStream(this, version);
      this.#streams.set(version, s);
    }
    return s;
  }

  /** The instance list changed: unused tickets are dropped, the next lease is over the new list. */
  invalidate(): void {
    this.#generation++;
    for (const s of this.#streams.values()) {
      s.reset();
    }
  }

  close(): void {
    this.#closed = true;
    this.#stopWatching();
    for (const s of this.#streams.values()) {
      s.close();
    }
  }
}

export class VersionStream {
  lastUse = 0;
  #cur: Block | undefined;
  #next: Block | undefined;
  #fetching = false;
  #k = INITIAL_LEASE;
  #activated = 0;
  #last: LeaseView | undefined;
  /** The picks of the last lease when rota mapped it itself (gray release), replayed while rota is unreachable. */
  #lastPicks: LeasedPicks | undefined;
  #offline = false;
  #localTicket = 0n;
  #refused: { code: status; details: string; until: number } | undefined;
  /**
   * The `exclude` of the last lease rota refused for leaving it no instance (`rota-error`
   * no_eligible_instance): leases go without `exclude` while the unusable ids are these.
   */
  #refusedExclude: string | undefined;
  #waiting = false;
  readonly #backoff: Backoff;
  #retry: NodeJS.Timeout | undefined;

  constructor(
    readonly owner: Leaser,
    readonly version: string,
  ) {
    this.#backoff = new Backoff(owner.link.backoff);
  }

  /** The size of the next lease. */
  get leaseSize(): number {
    return this.#k;
  }

  reset(): void {
    this.#cur = undefined;
    this.#next = undefined;
    this.#refused = undefined;
    this.#refusedExclude = undefined;
  }

  close(): void {
    clearTimeout(this.#retry);
  }

  take(): Take {
    const now = performance.now();
    this.lastUse = now;
    if (this.#offline) {
      const ticket = this.#localTicket;
      const replay = this.#lastPicks;
      if (replay !== undefined && this.#last !== undefined) {
        // After a gray lease, its picks over again (a local counter), keeping rota's last split.
        this.#localTicket++;
        const pick = replay.list[Number(ticket % BigInt(replay.list.length))]!;
        return { kind: 'ticket', draw: { ticket, view: this.#last, local: true, position: pick.position, named: replay.named } };
      }
      const view = this.#last ?? this.owner.localView(this.version);
      if (view === undefined) {
        return { kind: 'error', code: status.UNAVAILABLE, details: `rota is unreachable and no instance of "${this.owner.link.service}" is known` };
      }
      // A plain rotation over the view's usable instances (the picker turns the counter over
      // them in id order): the rule's weights and runs are not kept while rota is away.
      this.#localTicket++;
      return { kind: 'ticket', draw: { ticket, view, local: true } };
    }
    for (;;) {
      const cur = this.#cur;
      if (cur !== undefined && cur.used < cur.count) {
        const i = cur.used++;
        // Lease the next block once half of this one is spent.
        if (this.#next === undefined && !this.#fetching && cur.count - cur.used <= cur.count >> 1) {
          this.#fetch();
        }
        const pick = cur.picks?.list[i];
        const draw: Draw =
          pick === undefined
            ? { ticket: cur.first + BigInt(i), view: cur.view, local: false, position: cur.positions[i]! }
            : { ticket: pick.ticket, view: cur.view, local: false, position: pick.position, named: cur.picks!.named };
        return { kind: 'ticket', draw };
      }
      if (this.#next !== undefined) {
        this.#activate(this.#next, now);
        this.#next = undefined;
        continue;
      }
      if (this.#refused !== undefined && now < this.#refused.until) {
        return { kind: 'error', code: this.#refused.code, details: this.#refused.details };
      }
      if (!this.#fetching) {
        this.#fetch();
      }
      this.#waiting = true;
      return { kind: 'wait' };
    }
  }

  /** Makes `block` current; sizes the next lease from how fast the previous block was spent. */
  #activate(block: Block, now: number): void {
    const prev = this.#cur;
    if (prev !== undefined && this.#activated > 0) {
      const elapsed = Math.max(now - this.#activated, 0.001);
      const want = Math.min((prev.count * LEASE_TARGET_MS) / elapsed, this.#k * 16);
      this.#k = Math.round(Math.min(Math.max(want, MIN_LEASE), MAX_LEASE));
    }
    this.#cur = block;
    this.#activated = now;
  }

  /** Leases the next block; `withExclude` false sends no `exclude` (see {@link #leased}). */
  #fetch(withExclude = true): void {
    this.#fetching = true;
    const generation = this.owner.generation;
    const link = this.owner.link;
    const exclude = withExclude ? this.exclude() : [];
    leaseCalls.count++;
    link.balancer.Lease(
      { service: link.service, rule: this.owner.rule, version: this.version, count: this.#k, exclude },
      new Metadata(),
      { deadline: Date.now() + LEASE_TIMEOUT_MS },
      (error: ServiceError | null, response?: LeaseResponse__Output) => this.#leased(generation, exclude, error, response),
    );
  }

  /**
   * The ids a lease names in `exclude`: the unusable ones, the first {@link MAX_EXCLUDE} in id
   * order; none while they are those of a lease rota refused for leaving it no instance.
   */
  exclude(): string[] {
    const unusable = [...this.owner.unusable()].sort().slice(0, MAX_EXCLUDE);
    if (unusable.length === 0 || unusable.join('\n') === this.#refusedExclude) {
      return [];
    }
    return unusable;
  }

  /** Leases again after the backoff's next delay, while the stream is still offline. */
  #retryLater(): void {
    clearTimeout(this.#retry);
    this.#retry = setTimeout(() => {
      if (!this.#fetching && this.#offline && !this.owner.closed) {
        this.#fetch();
      }
    }, this.#backoff.next());
    this.#retry.unref();
  }

  #leased(generation: number, exclude: readonly string[], error: ServiceError | null, response: LeaseResponse__Output | undefined): void {
    this.#fetching = false;
    if (error !== null && exclude.length > 0 && error.code === status.UNAVAILABLE && error.metadata?.get('rota-error')[0] === 'no_eligible_instance' && !this.owner.closed) {
      // The exclude left rota no instance (every one unusable, or every one of a version a gray
      // split leases): leased again without it, the calls wait or skip as with no exclude.
      this.#refusedExclude = exclude.join('\n');
      this.#fetch(false);
      return;
    }
    if (this.owner.closed) {
      return;
    }
    if (generation !== this.owner.generation) {
      // An answer to a lease asked before the instance list changed: asked again, the calls
      // waiting still woken by the answer to that.
      this.#fetch();
      return;
    }
    let wake = this.#waiting;
    this.#waiting = false;
    const link = this.owner.link;
    let view: LeaseView | undefined;
    let picks: LeasedPicks | undefined;
    let positions: readonly number[] = [];
    let refusal: { code: status; details: string } | undefined;
    if (error === null && response !== undefined) {
      try {
        view = viewOf(response);
        picks = picksOf(response);
        if (picks === undefined) {
          positions = positionsOf(response);
        }
      } catch (e) {
        view = undefined;
        refusal = { code: status.INVALID_ARGUMENT, details: (e as Error).message };
      }
    } else if (error !== null && error.metadata?.get('rota-error').length > 0) {
      refusal = { code: error.code, details: error.details };
    }
    if (view !== undefined && response !== undefined) {
      this.#backoff.reset();
      this.#refused = undefined;
      if (this.#offline) {
        this.#offline = false;
        link.online();
      }
      if (sameView(this.#last, view)) {
        view = this.#last!;
      }
      this.#lastPicks = picks;
      this.#last = view;
      const block: Block =
        picks === undefined
          ? { first: BigInt(response.firstTicket), count: response.count, used: 0, view, positions, picks }
          : { first: 0n, count: picks.list.length, used: 0, view, positions, picks };
      if (this.#cur === undefined || this.#cur.used >= this.#cur.count) {
        this.#activate(block, performance.now());
      } else {
        this.#next = block;
      }
    } else if (refusal !== undefined) {
      this.#refused = { ...refusal, until: performance.now() + REFUSAL_MS };
      // Offline, calls take local tickets and never ask for a lease: a refusal (a restarted
      // rota that has not seen the service back yet) must not end the retries.
      if (this.#offline) {
        this.#retryLater();
      }
    } else {
      if (!this.#offline) {
        this.#offline = true;
        // Tickets held from before the outage are dropped: a restarted rota counts from 0 again.
        this.#cur = undefined;
        this.#next = undefined;
        link.offline(error?.details ?? 'no answer');
      }
      wake = true;
      this.#retryLater();
    }
    if (wake) {
      this.owner.wake();
    }
  }
}
