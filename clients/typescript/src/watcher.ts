// A background watch of one service that keeps its instance list in an InstanceCache.

import { status, type ClientReadableStream, type ServiceError, type StatusObject } from '@grpc/grpc-js';

import { Backoff, type BackoffOptions } from './backoff.js';
import { codeName } from './errors.js';
import type { InstanceCache } from './fallback.js';
import type { RegistryClient } from './generated/rota/v1/Registry.js';
import type { WatchEvent__Output } from './generated/rota/v1/WatchEvent.js';
import type { Logger } from './logger.js';
import { watchEventFromMessage } from './types.js';

/** Answers that another attempt would get again. */
const GIVE_UP: ReadonlySet<status> = new Set([
  status.INVALID_ARGUMENT,
  status.UNIMPLEMENTED,
  status.PERMISSION_DENIED,
  status.UNAUTHENTICATED,
]);

/** How long a watch must have lived for its end to start the reconnection backoff over. */
export const STABLE_STREAM_MS = 5_000;

/**
 * Follows one service: a `Watch` stream whose snapshot and changes go into the cache. When the
 * stream is lost it reconnects with backoff and keeps the last list meanwhile; the next
 * snapshot replaces it — except an empty one at epoch 0, what a rota that has not seen the
 * service since it started would send (its providers have not registered again yet); an empty
 * snapshot at a later epoch is rota's word and applied. The backoff starts over only after a stream lived
 * `STABLE_STREAM_MS`, so a server that accepts a watch and ends it at once (a draining rota)
 * is not asked again at the pace of the first retry.
 */
export class ServiceWatcher {
  readonly service: string;
  /** Settles once the first snapshot has arrived, or when the watcher is closed. */
  readonly ready: Promise<void>;
  readonly #registry: RegistryClient;
  readonly #cache: InstanceCache;
  readonly #logger: Logger;
  readonly #backoff: Backoff;
  /** Called on every snapshot: rota answered, so it is reachable again. */
  readonly #onSnapshot: () => void;
  #markReady!: () => void;
  #call: ClientReadableStream<WatchEvent__Output> | undefined;
  #retry: NodeJS.Timeout | undefined;
  #closed = false;
  #healthy = false;
  #openedAt = 0;

  constructor(
    service: string,
    registry: RegistryClient,
    cache: InstanceCache,
    logger: Logger,
    backoff?: BackoffOptions,
    onSnapshot: () => void = () => {},
  ) {
    this.service = service;
    this.#onSnapshot = onSnapshot;
    this.#registry = registry;
    this.#cache = cache;
    this.#logger = logger;
    this.#backoff = new Backoff(backoff);
    this.ready = new Promise((resolve) => {
      this.#markReady = resolve;
    });
  }

  start(): void {
    if (this.#closed || this.#call !== undefined) {
      return;
    }
    const call = this.#registry.Watch({ service: this.service });
    this.#call = call;
    this.#openedAt = Date.now();
    call.on('data', (message: WatchEvent__Output) => {
      if (this.#call === call) {
        this.#apply(message);
      }
    });
    // Errors also end in a 'status' event; this listener keeps them from being thrown.
    call.on('error', (_error: ServiceError) => {});
    call.on('status', (result: StatusObject) => {
      if (this.#call !== call) {
        return;
      }
      if (GIVE_UP.has(result.code)) {
        this.#call = undefined;
        this.#logger.warn(`rota: cannot watch "${this.service}" (${codeName(result.code)}: ${result.details}); not following it`);
        this.#markReady();
        return;
      }
      this.#lost(`${codeName(result.code)}: ${result.details}`);
    });
  }

  /** Reconnection attempts since the backoff last started over. */
  get attempt(): number {
    return this.#backoff.attempt;
  }

  close(): void {
    this.#closed = true;
    clearTimeout(this.#retry);
    const call = this.#call;
    this.#call = undefined;
    call?.cancel();
    this.#markReady();
  }

  #apply(message: WatchEvent__Output): void {
    const event = watchEventFromMessage(message);
    switch (event?.type) {
      case 'snapshot':
        this.#onSnapshot();
        if (event.instances.length === 0 && event.epoch === 0n && this.#cache.instances(this.service).length > 0) {
          // A restarted rota whose providers have not registered again: keep what the local
          // fallback picks from.
          break;
        }
        this.#cache.replace(this.service, event.instances, event.epoch);
        this.#healthy = true;
        this.#markReady();
        break;
      case 'added':
      case 'updated':
        this.#cache.upsert(event.instance, event.epoch);
        break;
      case 'removed':
        this.#cache.remove(event.instance, event.epoch);
        break;
      case undefined:
        break;
    }
  }

  #lost(reason: string): void {
    this.#call = undefined;
    if (this.#closed) {
      return;
    }
    // Logged once per outage: a stream that lived a while and is lost. Streams that end soon
    // after they open (rota down or draining) are retried quietly with a growing backoff.
    const stable = Date.now() - this.#openedAt >= STABLE_STREAM_MS;
    if (this.#healthy && stable) {
      const kept = this.#cache.instances(this.service).length;
      this.#logger.warn(`rota: watch of "${this.service}" lost (${reason}); keeping ${kept} cached instances`);
    }
    this.#healthy = false;
    if (stable) {
      this.#backoff.reset();
    }
    this.#retry = setTimeout(() => this.start(), this.#backoff.next());
    this.#retry.unref();
  }
}
