// A provider's registration: one Register stream, kept alive by heartbeats and re-established
// (with the same instances) when it is lost.

import { EventEmitter } from 'node:events';

import { status, type ClientDuplexStream, type StatusObject } from '@grpc/grpc-js';

import { Backoff, type BackoffOptions } from './backoff.js';
import { RegistrationRefusedError, RotaError, asRotaError, isUnreachable } from './errors.js';
import type { RegisterRequest } from './generated/rota/v1/RegisterRequest.js';
import type { RegisterResponse__Output } from './generated/rota/v1/RegisterResponse.js';
import type { RegistryClient } from './generated/rota/v1/Registry.js';
import type { Update } from './generated/rota/v1/Update.js';
import type { Logger } from './logger.js';
import {
  ackFromMessage,
  instanceId,
  instanceToMessage,
  type Ack,
  type InstanceRef,
  type InstanceSpec,
  type InstanceUpdate,
} from './types.js';

export interface RegistrationOptions {
  /**
   * Keep the registration when rota refuses some of the instances (they are listed in
   * `registration.ack.refused`). By default `register()` withdraws the accepted ones and
   * rejects with a `RegistrationRefusedError`.
   */
  allowPartial?: boolean;
  /** How long to wait for rota's acknowledgement of a message. Default 10 000 ms. */
  ackTimeoutMs?: number;
  /** How long `close()` waits for the withdrawal to be acknowledged. Default 2 000 ms. */
  closeTimeoutMs?: number;
  /** Delays between reconnection attempts. Default: 100 ms doubling to 10 s, full jitter. */
  backoff?: BackoffOptions;
}

export interface RegistrationEvents {
  /** The stream was lost; the registration reconnects by itself. */
  disconnect: [error: RotaError];
  /** A new stream is open and the instances were announced again on it. */
  reconnect: [ack: Ack];
  /** The registration was closed. */
  close: [];
}

type RegisterStream = ClientDuplexStream<RegisterRequest, RegisterResponse__Output>;

interface InFlight {
  resolve(ack: Ack): void;
  reject(error: RotaError): void;
  /** What the acknowledgement changes in the registration's own record. */
  apply(ack: Ack): void;
  timer: NodeJS.Timeout;
  settled: boolean;
}

/** rota refuses these only for a while (an old lease still holds the id, or rota shuts down). */
const RETRYABLE_REFUSALS: ReadonlySet<status> = new Set([status.ALREADY_EXISTS, status.UNAVAILABLE]);

const MIN_HEARTBEAT_TIMEOUT_MS = 300;
/** How long a stream must have lived for its loss to start the reconnection backoff over. */
const STABLE_STREAM_MS = 5_000;
const HEARTBEATS_PER_TIMEOUT = 3;

function key(ref: InstanceRef): string {
  return `${ref.service}\0${ref.id}`;
}

/**
 * An open registration. Its instances receive picks while it is open; `close()` (or
 * `await using`) withdraws them. Created by `RotaClient.register()`.
 *
 * Heartbeats go out every third of rota's heartbeat timeout. When the stream is lost
 * (rota restarted, network failure, expiry) the registration emits `disconnect`, reconnects with
 * exponential backoff and full jitter, announces the same instances again and emits `reconnect`.
 */
export class Registration extends EventEmitter<RegistrationEvents> implements AsyncDisposable {
  readonly #registry: RegistryClient;
  readonly #logger: Logger;
  readonly #ackTimeoutMs: number;
  readonly #closeTimeoutMs: number;
  readonly #backoff: Backoff;
  readonly #retryBackoff: Backoff;
  /** The instances this registration holds, as announced, by service and id. */
  readonly #held = new Map<string, InstanceSpec>();
  /**
   * Instances whose re-announcement rota refused for now, by service and id: announced again
   * until rota accepts them. An instance is held or retried, never both.
   */
  readonly #retrying = new Map<string, InstanceSpec>();
  readonly #inflight = new Map<bigint, InFlight>();
  #stream: RegisterStream | undefined;
  #live = false;
  #seq = 0n;
  #heartbeat: NodeJS.Timeout | undefined;
  #timer: NodeJS.Timeout | undefined;
  #retryTimer: NodeJS.Timeout | undefined;
  #closed = false;
  #closing: Promise<void> | undefined;
  /** The reconnection waiting for rota's acknowledgement of its announcement, if any. */
  #reconnecting: Promise<Ack> | undefined;
  #firstAck: Ack | undefined;
  #lastAck: Ack | undefined;
  /** Failed reconnection attempts since the stream was lost (the first one is logged). */
  #failedAttempts = 0;
  /** `Date.now()` when the live stream was announced. */
  #liveSince = 0;

  private constructor(registry: RegistryClient, options: RegistrationOptions, logger: Logger) {
    super();
    this.#registry = registry;
    this.#logger = logger;
    this.#ackTimeoutMs = options.ackTimeoutMs ?? 10_000;
    this.#closeTimeoutMs = options.closeTimeoutMs ?? 2_000;
    this.#backoff = new Backoff(options.backoff);
    this.#retryBackoff = new Backoff(options.backoff);
  }

  /** @internal Use `RotaClient.register()`. */
  static async open(
    registry: RegistryClient,
    instances: readonly InstanceSpec[],
    options: RegistrationOptions,
    logger: Logger,
  ): Promise<Registration> {
    const registration = new Registration(registry, options, logger);
    const ack = await registration.#connect(instances);
    registration.#firstAck = ack;
    if (ack.refused.length > 0 && options.allowPartial !== true) {
      await registration.close();
      throw new RegistrationRefusedError(ack.accepted, ack.refused);
    }
    return registration;
  }

  /** The acknowledgement of the first announcement: which instances were accepted or refused. */
  get ack(): Ack {
    return this.#firstAck as Ack;
  }

  /** The lease of the current (or last) stream. */
  get leaseId(): bigint {
    return this.#lastAck?.leaseId ?? 0n;
  }

  /** True while a stream is open and announced; false while reconnecting and once closed. */
  get connected(): boolean {
    return this.#live;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /**
   * The instances this registration holds (announces again after a reconnection); one whose
   * re-announcement rota refused for now is left out until rota accepts it.
   */
  get instances(): InstanceRef[] {
    return [...this.#held.values()].map((spec) => ({ service: spec.service, id: instanceId(spec) }));
  }

  /**
   * Adds instances to the registration (announcing an id it already holds replaces it).
   * Resolves with rota's acknowledgement; refused instances are listed in `ack.refused`.
   */
  announce(instances: InstanceSpec | readonly InstanceSpec[]): Promise<Ack> {
    const specs = Array.isArray(instances) ? [...(instances as readonly InstanceSpec[])] : [instances as InstanceSpec];
    return this.#request({ announce: { instances: specs.map(instanceToMessage) } }, (ack) => this.#hold(specs, ack));
  }

  /** Changes one held instance: its status (e.g. `DRAINING`), weight or metadata. */
  update(instance: InstanceRef, changes: InstanceUpdate): Promise<Ack> {
    const update: Update = {
      instance: { service: instance.service, id: instance.id },
      status: changes.status ?? 'INSTANCE_STATUS_UNSPECIFIED',
    };
    if (changes.weight !== undefined) {
      update.weight = changes.weight;
    }
    if (changes.metadata !== undefined) {
      update.metadata = { entries: { ...changes.metadata } };
    }
    return this.#request({ update }, (ack) => {
      for (const ref of ack.accepted) {
        const spec = this.#held.get(key(ref));
        if (spec !== undefined) {
          this.#held.set(key(ref), {
            ...spec,
            ...(changes.status !== undefined ? { status: changes.status } : {}),
            ...(changes.weight !== undefined ? { weight: changes.weight } : {}),
            ...(changes.metadata !== undefined ? { metadata: { ...changes.metadata } } : {}),
          });
        }
      }
    });
  }

  /** Removes some held instances, or all of them when none are named. The stream stays open. */
  withdraw(instances: readonly InstanceRef[] = []): Promise<Ack> {
    const refs = instances.map((ref) => ({ service: ref.service, id: ref.id }));
    return this.#request({ withdraw: { instances: refs } }, (ack) => this.#release(refs, ack));
  }

  /**
   * Withdraws every instance (waiting briefly for rota's acknowledgement) and closes the
   * stream. Safe to call more than once.
   */
  close(): Promise<void> {
    this.#closing ??= this.#shutdown();
    return this.#closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  // -------------------------------------------------------------------------------------------

  async #connect(instances: readonly InstanceSpec[]): Promise<Ack> {
    let stream: RegisterStream;
    try {
      stream = this.#registry.Register();
    } catch (error) {
      throw asRotaError(error);
    }
    this.#stream = stream;
    this.#seq = 0n;
    stream.on('data', (message: RegisterResponse__Output) => this.#onMessage(stream, message));
    // Errors also end in a 'status' event; this listener keeps them from being thrown.
    stream.on('error', () => {});
    stream.on('status', (status: StatusObject) => this.#onLost(stream, streamEnded(status)));

    const specs = [...instances];
    const ack = await this.#send(stream, { announce: { instances: specs.map(instanceToMessage) } }, this.#ackTimeoutMs, (a) =>
      this.#hold(specs, a),
    ).catch((error: unknown) => {
      this.#onLost(stream, asRotaError(error));
      throw error;
    });
    if (this.#closed) {
      if (this.#stream === stream && ack.accepted.length > 0) {
        // close() began while this announcement was being answered: rota holds the instances
        // on this stream now, so withdraw them before ending it.
        await this.#send(stream, { withdraw: { instances: [] } }, this.#closeTimeoutMs, () => {}).catch(() => undefined);
      }
      this.#onLost(stream, closedError());
      throw closedError();
    }
    if (this.#stream !== stream) {
      // The stream ended right after the acknowledgement (rota sent Closing): nothing is live.
      throw new RotaError(status.UNAVAILABLE, 'rota ended the registration stream right after acknowledging it', {
        unreachable: true,
      });
    }
    this.#live = true;
    this.#liveSince = Date.now();
    this.#startHeartbeats(stream, ack.heartbeatTimeoutMs);
    return ack;
  }

  #send(stream: RegisterStream, message: RegisterRequest, timeoutMs: number, apply: (ack: Ack) => void): Promise<Ack> {
    this.#seq += 1n;
    const seq = this.#seq;
    return new Promise<Ack>((resolve, reject) => {
      const entry: InFlight = {
        resolve,
        reject,
        apply,
        settled: false,
        timer: setTimeout(() => {
          entry.settled = true;
          reject(new RotaError(status.DEADLINE_EXCEEDED, `no acknowledgement from rota within ${timeoutMs} ms`));
        }, timeoutMs),
      };
      this.#inflight.set(seq, entry);
      stream.write(message);
    });
  }

  #request(message: RegisterRequest, apply: (ack: Ack) => void): Promise<Ack> {
    if (this.#closed) {
      return Promise.reject(closedError());
    }
    const stream = this.#stream;
    if (stream === undefined || !this.#live) {
      return Promise.reject(
        new RotaError(status.UNAVAILABLE, 'the registration stream is reconnecting', { unreachable: true }),
      );
    }
    return this.#send(stream, message, this.#ackTimeoutMs, apply);
  }

  #onMessage(stream: RegisterStream, message: RegisterResponse__Output): void {
    if (stream !== this.#stream) {
      return;
    }
    if (message.msg === 'closing') {
      const reason = message.closing?.reason ?? '';
      this.#onLost(stream, new RotaError(status.UNAVAILABLE, `rota closed the registration: ${reason}`));
      return;
    }
    if (message.msg !== 'ack' || message.ack === null || message.ack === undefined) {
      return;
    }
    const ack = ackFromMessage(message.ack);
    this.#lastAck = ack;
    const entry = this.#inflight.get(ack.seq);
    if (entry === undefined) {
      return;
    }
    this.#inflight.delete(ack.seq);
    clearTimeout(entry.timer);
    // Applied even when the caller stopped waiting: the record follows what rota did.
    entry.apply(ack);
    if (!entry.settled) {
      entry.settled = true;
      entry.resolve(ack);
    }
  }

  /** Ends `stream` for good; starts reconnecting if it was the live stream of an open registration. */
  #onLost(stream: RegisterStream, error: RotaError): void {
    if (stream !== this.#stream) {
      return;
    }
    const wasLive = this.#live;
    this.#stream = undefined;
    this.#live = false;
    clearInterval(this.#heartbeat);
    clearTimeout(this.#retryTimer);
    for (const entry of this.#inflight.values()) {
      clearTimeout(entry.timer);
      if (!entry.settled) {
        entry.settled = true;
        entry.reject(error);
      }
    }
    this.#inflight.clear();
    stream.cancel();
    if (wasLive && !this.#closed) {
      this.#logger.warn(`rota: registration stream lost (${error.message}); reconnecting`);
      if (Date.now() - this.#liveSince >= STABLE_STREAM_MS) {
        this.#backoff.reset();
      }
      this.#failedAttempts = 0;
      this.emit('disconnect', error);
      this.#scheduleReconnect();
    }
  }

  #scheduleReconnect(): void {
    this.#timer = setTimeout(() => void this.#reconnect(), this.#backoff.next());
    this.#timer.unref();
  }

  async #reconnect(): Promise<void> {
    if (this.#closed) {
      return;
    }
    let ack: Ack;
    const announced = [...this.#held.values(), ...this.#retrying.values()];
    const connecting = this.#connect(announced);
    this.#reconnecting = connecting;
    try {
      ack = await connecting;
      if (announced.length > 0 && ack.accepted.length === 0 && ack.refused.some((r) => r.code === status.UNAVAILABLE)) {
        // A draining rota acknowledges the announcement with a refusal and closes the stream:
        // that is no reconnection, and no reason to start the backoff over.
        const refusal = ack.refused.find((r) => r.code === status.UNAVAILABLE);
        throw new RotaError(status.UNAVAILABLE, `rota refused the announcement: ${refusal?.message ?? ''}`);
      }
    } catch (error) {
      if (!this.#closed) {
        const stream = this.#stream;
        // Not live any more: ending the stream neither logs a loss nor schedules a reconnection.
        this.#live = false;
        if (stream !== undefined) {
          this.#onLost(stream, asRotaError(error));
        }
        if (this.#failedAttempts === 0) {
          this.#logger.warn(`rota: reconnecting the registration failed (${asRotaError(error).message}); retrying with backoff`);
        }
        this.#failedAttempts += 1;
        this.#scheduleReconnect();
      }
      return;
    } finally {
      this.#reconnecting = undefined;
    }
    this.#failedAttempts = 0;
    this.#backoff.reset();
    this.#retryBackoff.reset();
    this.#keepRetrying(ack);
    this.#logger.warn(`rota: registration reconnected (lease ${ack.leaseId}, ${ack.accepted.length} instances announced)`);
    this.emit('reconnect', ack);
  }

  /**
   * After a re-announcement, instances refused for a passing reason (an old lease of the same
   * provider not yet expired) are announced again with backoff; the others are given up.
   */
  #keepRetrying(ack: Ack): void {
    for (const refusal of ack.refused) {
      const k = key(refusal.instance);
      const spec = this.#held.get(k) ?? this.#retrying.get(k);
      if (spec === undefined) {
        continue;
      }
      this.#held.delete(k);
      if (RETRYABLE_REFUSALS.has(refusal.code)) {
        this.#retrying.set(k, spec);
      } else {
        this.#retrying.delete(k);
        this.#logger.warn(
          `rota: ${refusal.instance.service}/${refusal.instance.id} refused on re-announcement (${refusal.message}); dropped`,
        );
      }
    }
    const stream = this.#stream;
    if (this.#retrying.size === 0 || stream === undefined) {
      return;
    }
    this.#retryTimer = setTimeout(() => {
      const retry = [...this.#retrying.values()];
      if (this.#stream !== stream || !this.#live || this.#closed || retry.length === 0) {
        return;
      }
      this.#send(stream, { announce: { instances: retry.map(instanceToMessage) } }, this.#ackTimeoutMs, (a) => this.#hold(retry, a))
        .then((next) => this.#keepRetrying(next))
        .catch(() => {});
    }, this.#retryBackoff.next());
    this.#retryTimer.unref();
  }

  #hold(specs: readonly InstanceSpec[], ack: Ack): void {
    const byKey = new Map(specs.map((spec) => [key({ service: spec.service, id: instanceId(spec) }), spec]));
    for (const ref of ack.accepted) {
      const spec = byKey.get(key(ref));
      if (spec !== undefined) {
        this.#held.set(key(ref), { ...spec, id: ref.id });
        this.#retrying.delete(key(ref));
      }
    }
  }

  #release(refs: readonly InstanceRef[], ack: Ack): void {
    if (refs.length === 0) {
      this.#held.clear();
      this.#retrying.clear();
      return;
    }
    for (const ref of ack.accepted) {
      this.#held.delete(key(ref));
    }
    // rota holds no retried instance on this stream (so it refuses to withdraw one); it is no
    // longer wanted all the same.
    for (const ref of refs) {
      this.#retrying.delete(key(ref));
    }
  }

  #startHeartbeats(stream: RegisterStream, heartbeatTimeoutMs: number): void {
    clearInterval(this.#heartbeat);
    const interval = Math.max(heartbeatTimeoutMs, MIN_HEARTBEAT_TIMEOUT_MS) / HEARTBEATS_PER_TIMEOUT;
    this.#heartbeat = setInterval(() => {
      if (this.#stream === stream && this.#live) {
        stream.write({ heartbeat: {} });
      }
    }, interval);
    this.#heartbeat.unref();
  }

  async #shutdown(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#timer);
    clearTimeout(this.#retryTimer);
    const reconnecting = this.#reconnecting;
    if (reconnecting !== undefined) {
      // A re-announcement is in flight: once answered, it withdraws what rota registered on
      // its stream (see #connect). Past closeTimeoutMs the stream is ended below instead.
      let timer: NodeJS.Timeout | undefined;
      const timedOut = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, this.#closeTimeoutMs);
      });
      await Promise.race([reconnecting.then(() => undefined, () => undefined), timedOut]);
      clearTimeout(timer);
    }
    const stream = this.#stream;
    if (stream === undefined) {
      this.#held.clear();
      this.#retrying.clear();
      this.emit('close');
      return;
    }
    if (this.#live && (this.#held.size > 0 || this.#inflight.size > 0)) {
      try {
        await this.#send(stream, { withdraw: { instances: [] } }, this.#closeTimeoutMs, () => this.#held.clear());
      } catch (error) {
        this.#logger.warn(`rota: withdrawal on close not acknowledged (${asRotaError(error).message}); closing anyway`);
      }
    }
    if (this.#stream === stream) {
      // Half-close, then give rota a moment to end the stream before cancelling it.
      const ended = new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, this.#closeTimeoutMs);
        stream.once('status', () => {
          clearTimeout(timer);
          resolve();
        });
      });
      stream.end();
      await ended;
    }
    this.#onLost(stream, closedError());
    this.#held.clear();
    this.#retrying.clear();
    this.emit('close');
  }
}

function closedError(): RotaError {
  return new RotaError(status.CANCELLED, 'the registration is closed');
}

function streamEnded(result: StatusObject): RotaError {
  if (result.code === status.OK) {
    return new RotaError(status.UNAVAILABLE, 'rota ended the registration stream');
  }
  return new RotaError(result.code, result.details, { metadata: result.metadata, unreachable: isUnreachable(result) });
}
