// One channel's connection to rota, shared by its resolver (Watch) and its policy (Lease,
// Report), with the batching of call outcomes.

import { Channel, credentials as grpcCredentials } from '@grpc/grpc-js';

import { Backoff, type BackoffOptions } from '../backoff.js';
import type { BalancerClient } from '../generated/rota/v1/Balancer.js';
import type { CallOutcome } from '../generated/rota/v1/CallOutcome.js';
import type { RegistryClient } from '../generated/rota/v1/Registry.js';
import type { Logger } from '../logger.js';
import { rotaV1 } from '../proto.js';
import type { RotaConnection } from '../rota-connection.js';

const REPORT_INTERVAL_MS = 100;
const MAX_REPORT_BATCH = 1_000;
const MAX_PENDING_OUTCOMES = 20_000;
const REPORT_DEADLINE_MS = 2_000;

export class RotaLink {
  readonly balancer: BalancerClient;
  readonly registry: RegistryClient;
  readonly #channel: Channel;
  #pending: CallOutcome[] = [];
  #reporting = false;
  #flushQueued = false;
  #dropped = 0;
  #dropping = false;
  #timer: NodeJS.Timeout;
  #offline = false;
  #closed = false;
  #channelClosed = false;
  readonly #watchLost = new Set<() => void>();

  constructor(
    readonly server: string,
    readonly service: string,
    readonly logger: Logger,
    readonly backoff: BackoffOptions,
    connection: Pick<RotaConnection, 'credentials' | 'interceptors'> = { credentials: grpcCredentials.createInsecure(), interceptors: [] },
    reportIntervalMs = REPORT_INTERVAL_MS,
  ) {
    const rota = rotaV1();
    const { credentials, interceptors } = connection;
    // The connection to rota reconnects on the channel's own backoff, not grpc-js's (1 s
    // doubling to 120 s): after rota restarts, leases resume within the backoff's ceiling
    // instead of failing fast for as long as a long-grown reconnect delay lasts.
    const reconnect = new Backoff(backoff);
    this.#channel = new Channel(server, credentials, {
      'grpc.initial_reconnect_backoff_ms': reconnect.initialMs,
      'grpc.max_reconnect_backoff_ms': reconnect.maxMs,
    });
    this.balancer = new rota.Balancer(server, credentials, { channelOverride: this.#channel, interceptors });
    this.registry = new rota.Registry(server, credentials, { channelOverride: this.#channel, interceptors });
    this.#timer = setInterval(() => this.#flush(), reportIntervalMs);
    this.#timer.unref();
  }

  /**
   * Queues a call outcome, off the call's path: outcomes go to rota in Report calls of at most
   * MAX_REPORT_BATCH, every report interval or as soon as a full batch waits. While rota is
   * away at most MAX_PENDING_OUTCOMES wait; the oldest are dropped (and counted) past that.
   */
  report(outcome: CallOutcome): void {
    if (this.#pending.length >= MAX_PENDING_OUTCOMES) {
      this.#pending.shift();
      this.#drop(1);
    }
    this.#pending.push(outcome);
    if (this.#closed) {
      this.#drainThenClose();
      return;
    }
    // Exactly at a full batch: while rota is away the buffer stays above it, and flushing on
    // every call would retry a failing Report in a loop.
    if (this.#pending.length === MAX_REPORT_BATCH) {
      this.#flushSoon();
    }
  }

  /** Outcomes dropped for lack of room since the channel started. */
  get droppedOutcomes(): number {
    return this.#dropped;
  }

  #drop(n: number): void {
    this.#dropped += n;
    if (!this.#dropping) {
      this.#dropping = true;
      this.logger.warn(`rota: call outcomes of "${this.service}" not reported in time; dropping the oldest beyond ${MAX_PENDING_OUTCOMES}`);
    }
  }

  #flushSoon(): void {
    if (!this.#flushQueued && !this.#reporting) {
      this.#flushQueued = true;
      setImmediate(() => {
        this.#flushQueued = false;
        this.#flush();
      });
    }
  }

  #flush(): void {
    if (this.#reporting || this.#pending.length === 0) {
      return;
    }
    const batch = this.#pending.splice(0, MAX_REPORT_BATCH);
    this.#reporting = true;
    // Every outcome a channel reports is of a call no unary pick counted in flight at rota.
    const outcomes = batch.map((o) => ({ ...o, leased: true }));
    this.balancer.Report({ outcomes }, { deadline: Date.now() + REPORT_DEADLINE_MS }, (error) => {
      this.#reporting = false;
      if (this.#closed) {
        // Closing: what is left goes next, unless rota did not take this batch (then it
        // would not take the rest in time either).
        if (error !== null) {
          this.#drop(this.#pending.length + batch.length);
          this.#pending = [];
        }
        this.#drainThenClose();
        return;
      }
      if (error !== null) {
        this.#pending = batch.concat(this.#pending);
        const excess = this.#pending.length - MAX_PENDING_OUTCOMES;
        if (excess > 0) {
          this.#pending.splice(0, excess);
          this.#drop(excess);
        }
        return;
      }
      this.#dropping = false;
      if (this.#pending.length >= MAX_REPORT_BATCH) {
        this.#flushSoon();
      }
    });
  }

  /**
   * Calls `listener` whenever the resolver's Watch of rota ends (rota stopped, restarted or
   * unreachable); returns a function that stops it.
   */
  onWatchLost(listener: () => void): () => void {
    this.#watchLost.add(listener);
    return () => this.#watchLost.delete(listener);
  }

  /** The resolver's Watch ended. */
  watchLost(): void {
    for (const listener of this.#watchLost) {
      listener();
    }
  }

  /** A lease failed for lack of rota: logged once until rota answers again. */
  offline(reason: string): void {
    if (!this.#offline) {
      this.#offline = true;
      this.logger.warn(`rota: unreachable (${reason}); routing calls to "${this.service}" over the last known instances with a local rotation`);
    }
  }

  online(): void {
    if (this.#offline) {
      this.#offline = false;
      this.logger.warn(`rota: reachable again; calls to "${this.service}" follow leases again`);
    }
  }

  /**
   * Stops reporting on a timer and closes the connection once every outcome still queued has
   * been sent (each Report bounded by its deadline; a failed one drops the rest), so the calls
   * a channel made just before it closed still count at rota.
   */
  close(): void {
    if (this.#closed) {
      return;
    }
    this.#closed = true;
    clearInterval(this.#timer);
    this.#drainThenClose();
  }

  #drainThenClose(): void {
    if (this.#reporting) {
      return; // the Report under way continues the drain when it completes
    }
    if (this.#channelClosed) {
      // Outcomes of calls that ended after the connection closed: nowhere to send them.
      if (this.#pending.length > 0) {
        this.#drop(this.#pending.length);
        this.#pending = [];
      }
      return;
    }
    if (this.#pending.length === 0) {
      this.#channelClosed = true;
      this.#channel.close();
      return;
    }
    this.#flush();
  }
}
