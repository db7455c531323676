// One channel's connection to rota, shared by its resolver (Watch) and its policy (Lease,
// Report), with the batching of call outcomes.

import { Channel, credentials as grpcCredentials, type ChannelCredentials } from '@grpc/grpc-js';

import type { BackoffOptions } from '../backoff.js';
import type { BalancerClient } from '../generated/rota/v1/Balancer.js';
import type { CallOutcome } from '../generated/rota/v1/CallOutcome.js';
import type { RegistryClient } from '../generated/rota/v1/Registry.js';
import type { Logger } from '../logger.js';
import { rotaV1 } from '../proto.js';

const REPORT_INTERVAL_MS = 100;
const MAX_REPORT_BATCH = 1_000;
const MAX_PENDING_OUTCOMES = 20_000;

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

  constructor(
    readonly server: string,
    readonly service: string,
    readonly logger: Logger,
    readonly backoff: BackoffOptions,
    credentials: ChannelCredentials = grpcCredentials.createInsecure(),
    reportIntervalMs = REPORT_INTERVAL_MS,
  ) {
    const rota = rotaV1();
    this.#channel = new Channel(server, credentials, {});
    this.balancer = new rota.Balancer(server, credentials, { channelOverride: this.#channel });
    this.registry = new rota.Registry(server, credentials, { channelOverride: this.#channel });
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
    this.balancer.Report({ outcomes }, { deadline: Date.now() + 2_000 }, (error) => {
      this.#reporting = false;
      if (this.#closed) {
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

  close(): void {
    this.#closed = true;
    clearInterval(this.#timer);
    this.#flush();
    this.#channel.close();
  }
}
