// RotaClient: one connection to a rota server.

import {
  Channel,
  Metadata,
  status,
  type CallOptions,
  type ChannelCredentials,
  type ChannelOptions,
  type ServiceError,
} from '@grpc/grpc-js';

import type { BackoffOptions } from './backoff.js';
import { NO_ELIGIBLE_INSTANCE, RotaError, asRotaError, fallsBack, neverAnswered } from './errors.js';
import { InstanceCache } from './fallback.js';
import type { BalancerClient } from './generated/rota/v1/Balancer.js';
import type { ListInstancesResponse__Output } from './generated/rota/v1/ListInstancesResponse.js';
import type { ListServicesResponse__Output } from './generated/rota/v1/ListServicesResponse.js';
import type { PickRequest__Output } from './generated/rota/v1/PickRequest.js';
import type { PickResponse__Output } from './generated/rota/v1/PickResponse.js';
import type { RegistryClient } from './generated/rota/v1/Registry.js';
import type { ReportResponse__Output } from './generated/rota/v1/ReportResponse.js';
import type { WatchEvent__Output } from './generated/rota/v1/WatchEvent.js';
import { consoleLogger, type Logger } from './logger.js';
import { rotaV1 } from './proto.js';
import { bareTarget, rotaConnection, type RotaAuthOptions } from './rota-connection.js';
import { Registration, type RegistrationOptions } from './registration.js';
import {
  instanceFromMessage,
  outcomeToMessage,
  pickResultFromMessage,
  u64,
  watchEventFromMessage,
  type CallOutcome,
  type CallResult,
  type Instance,
  type InstanceList,
  type InstanceSpec,
  type PickOptions,
  type PickResult,
  type ReportResult,
  type ServiceSummary,
  type WatchEvent,
} from './types.js';
import { currentVersion } from './version.js';
import { ServiceWatcher } from './watcher.js';

/**
 * `token`, `tlsCa`, `tlsCert` and `tlsKey` (see {@link RotaAuthOptions}) default to `ROTA_TOKEN`,
 * `ROTA_TLS_CA`, `ROTA_TLS_CERT` and `ROTA_TLS_KEY`.
 */
export interface RotaClientOptions extends RotaAuthOptions {
  /**
   * Default: TLS with `tlsCa` or an `https://` target, else plaintext (`credentials.createInsecure()`).
   * Replaces the TLS options; the token still applies.
   */
  credentials?: ChannelCredentials;
  /** grpc-js channel options, e.g. `{ 'grpc.use_local_subchannel_pool': 1 }` for a connection of its own. */
  channelOptions?: ChannelOptions;
  /** Deadline of a pick; past it the pick counts as rota being unreachable. Default 2 000 ms. */
  pickTimeoutMs?: number;
  /**
   * How long picks go straight to the local fallback after `UNREACHABLE_STREAK` (3) unreachable
   * picks in a row, before rota is asked again. Default 1 000 ms.
   */
  shortCutMs?: number;
  /** How long `follow()` waits for the first instance list by default. Default 5 000 ms. */
  followTimeoutMs?: number;
  /** Deadline of the other unary calls (report, listings). Default 5 000 ms. */
  timeoutMs?: number;
  /** Services to follow from the start (see `follow()`). */
  follow?: readonly string[];
  /** Where reconnections and local fallback picks are logged. Default: `console`. */
  logger?: Logger;
  /** Reconnection delays of registrations and watches. Default: 100 ms doubling to 10 s, full jitter. */
  backoff?: BackoffOptions;
  /** Defaults for `register()`. */
  registration?: RegistrationOptions;
}

export interface ConnectOptions extends RotaClientOptions {
  /** How long `connect()` waits for the connection. Default 5 000 ms. */
  connectTimeoutMs?: number;
}

export interface TimedOptions {
  /** Maps an error thrown by the call to its outcome. Default: see `classifyError`. */
  classify?: (error: unknown) => CallResult;
}

/**
 * grpc-js reconnects a lost connection on its own schedule (1 s, growing to 120 s) and fails
 * calls at once meanwhile; this brings it in line with the client's own reconnection backoff.
 * HTTP/2 keepalive pings (after 20 s without traffic while a call such as a watch is open,
 * answered within 5 s) notice a rota that stopped answering without closing the connection.
 */
const CHANNEL_DEFAULTS: ChannelOptions = {
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': 10_000,
  'grpc.keepalive_time_ms': 20_000,
  'grpc.keepalive_timeout_ms': 5_000,
};

/** Unreachable picks in a row after which picks short-cut to the local fallback. */
export const UNREACHABLE_STREAK = 3;

type Callback<T> = (error: ServiceError | null, value?: T) => void;

/** Where `rota serve` listens by default: the client's target when none is given. */
export const DEFAULT_TARGET = '127.0.0.1:50051';
/** The environment variable naming rota's address when the constructor is given none. */
export const TARGET_ENV = 'ROTA_SERVER';

/**
 * `host:port`, or a grpc-js target (`dns:///host:port`); `http://host:port` and
 * `https://host:port` are accepted too. No target (or an empty one): `ROTA_SERVER`, else
 * {@link DEFAULT_TARGET}.
 */
export function normalizeTarget(target: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  return bareTarget(chosenTarget(target, env));
}

function chosenTarget(target: string | undefined, env: NodeJS.ProcessEnv): string {
  return target || env[TARGET_ENV] || DEFAULT_TARGET;
}

/** The wire request of a pick; the current version applies when `options.version` is left out. */
export function pickRequest(service: string, options: PickOptions = {}): PickRequest__Output {
  return {
    service,
    rule: options.rule ?? '',
    version: options.version ?? currentVersion() ?? '',
    key: options.key ?? '',
    zone: options.zone ?? '',
    exclude: [...(options.exclude ?? [])],
  };
}

const CONNECT_ERRORS = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ETIMEDOUT',
  'UND_ERR_CONNECT_TIMEOUT',
]);

/**
 * The default outcome of a failed call: `CONNECT_FAILURE` when the instance could not be
 * reached (a socket error such as `ECONNREFUSED`, also as the `cause` of a `fetch` failure, or a
 * gRPC call that never got an answer), `ERROR` otherwise.
 */
export function classifyError(error: unknown): CallResult {
  for (let current: unknown = error, depth = 0; current !== null && typeof current === 'object' && depth < 4; depth += 1) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === 'string' && CONNECT_ERRORS.has(code)) {
      return 'CONNECT_FAILURE';
    }
    if (typeof code === 'number' && (current as Partial<ServiceError>).metadata instanceof Metadata) {
      return neverAnswered(current as ServiceError) ? 'CONNECT_FAILURE' : 'ERROR';
    }
    current = (current as { cause?: unknown }).cause;
  }
  return 'ERROR';
}

/**
 * One connection to a rota server, for consumers (`pick`, `report`, `timed`) and providers
 * (`register`). Calls are promise-based; failures reject with a `RotaError`.
 *
 * ```ts
 * const rota = new RotaClient('127.0.0.1:50051');
 * const { instance } = await rota.pick('orders', { rule: 'repeat(n=3)' });
 * ```
 */
export class RotaClient implements AsyncDisposable {
  /** The server address as grpc-js uses it. */
  readonly target: string;
  readonly #channel: Channel;
  readonly #balancer: BalancerClient;
  readonly #registry: RegistryClient;
  readonly #pickTimeoutMs: number;
  readonly #shortCutMs: number;
  readonly #followTimeoutMs: number;
  readonly #timeoutMs: number;
  readonly #logger: Logger;
  readonly #backoff: BackoffOptions | undefined;
  readonly #registrationDefaults: RegistrationOptions;
  readonly #cache = new InstanceCache();
  readonly #watchers = new Map<string, ServiceWatcher>();
  readonly #registrations = new Set<Registration>();
  #closing: Promise<void> | undefined;
  /** Unreachable picks in a row. */
  #unreachableStreak = 0;
  /** `Date.now()` until which picks short-cut to the local fallback; 0 when they do not. */
  #shortCutUntil = 0;
  /** Whether the current outage was logged (at its first local pick). */
  #outageLogged = false;

  /**
   * `target` defaults to `ROTA_SERVER`, else {@link DEFAULT_TARGET} (`127.0.0.1:50051`). Throws
   * for TLS options that cannot work: a lone `tlsCert` or `tlsKey`, an `https://` target without
   * a CA, a file that cannot be read, or both `credentials` and TLS options.
   */
  constructor(target?: string, options: RotaClientOptions = {}) {
    const connection = rotaConnection(chosenTarget(target, process.env), options, options.credentials);
    this.target = connection.target;
    const rota = rotaV1();
    const { credentials, interceptors } = connection;
    this.#channel = new Channel(this.target, credentials, { ...CHANNEL_DEFAULTS, ...options.channelOptions });
    this.#balancer = new rota.Balancer(this.target, credentials, { channelOverride: this.#channel, interceptors });
    this.#registry = new rota.Registry(this.target, credentials, { channelOverride: this.#channel, interceptors });
    this.#pickTimeoutMs = options.pickTimeoutMs ?? 2_000;
    this.#shortCutMs = options.shortCutMs ?? 1_000;
    this.#followTimeoutMs = options.followTimeoutMs ?? 5_000;
    this.#timeoutMs = options.timeoutMs ?? 5_000;
    this.#logger = options.logger ?? consoleLogger;
    this.#backoff = options.backoff;
    this.#registrationDefaults = { ...options.registration };
    for (const service of options.follow ?? []) {
      this.#watcher(service);
    }
  }

  /** Creates a client and waits until its connection is up; rejects with `UNAVAILABLE` if it does not come up in time. */
  static async connect(target?: string, options: ConnectOptions = {}): Promise<RotaClient> {
    const client = new RotaClient(target, options);
    try {
      await client.waitForReady(options.connectTimeoutMs ?? 5_000);
    } catch (error) {
      await client.close();
      throw error;
    }
    return client;
  }

  /** Resolves once the connection is up; rejects with `UNAVAILABLE` after `timeoutMs`. */
  waitForReady(timeoutMs: number): Promise<void> {
    return new Promise((resolve, reject) => {
      this.#balancer.waitForReady(Date.now() + timeoutMs, (error) => {
        if (error === undefined || error === null) {
          resolve();
        } else {
          reject(
            new RotaError(status.UNAVAILABLE, `cannot connect to rota at ${this.target}: ${error.message}`, {
              unreachable: true,
            }),
          );
        }
      });
    });
  }

  // ----- consumers --------------------------------------------------------------------------

  /**
   * Picks one instance of `service`. Without `options.version`, the current version of the async
   * context applies (see `withVersion`).
   *
   * When rota's answer cannot be had (transport failure, deadline, or rota `warming_up` after a
   * restart) and the service is followed, the instance is picked locally as rota would by round
   * robin over the last list seen (version isolation, then exclusions; tickets 0, 1, 2, ... per
   * service and version subset) and the result has `localFallback: true`; nothing eligible
   * rejects with `UNAVAILABLE` (reason `no_eligible_instance`). Any other answer of rota,
   * `UNAVAILABLE` included, is final. After `UNREACHABLE_STREAK` unreachable picks in a row,
   * picks go straight to the fallback for `shortCutMs` before rota is asked again. The first
   * local pick of an outage is logged, and the recovery; nothing per pick.
   */
  async pick(service: string, options: PickOptions = {}): Promise<PickResult> {
    const request = pickRequest(service, options);
    if (this.#shortCutUntil !== 0) {
      if (Date.now() < this.#shortCutUntil) {
        return this.#pickLocally(
          request,
          new RotaError(
            status.UNAVAILABLE,
            `rota unreachable (${UNREACHABLE_STREAK} picks in a row failed); not asked again for ${this.#shortCutMs} ms`,
            { unreachable: true },
          ),
        );
      }
      this.#shortCutUntil = 0;
    }
    let response: PickResponse__Output;
    try {
      response = await this.#unary<PickResponse__Output>(
        (metadata, callOptions, callback) => this.#balancer.Pick(request, metadata, callOptions, callback),
        options.timeoutMs ?? this.#pickTimeoutMs,
      );
    } catch (error) {
      const failure = asRotaError(error);
      if (!fallsBack(failure)) {
        this.#rotaAnswered();
        throw failure;
      }
      this.#unreachableStreak += 1;
      if (this.#unreachableStreak >= UNREACHABLE_STREAK) {
        this.#shortCutUntil = Date.now() + this.#shortCutMs;
      }
      return this.#pickLocally(request, failure);
    }
    this.#rotaAnswered();
    return pickResultFromMessage(response);
  }

  /**
   * rota answered a pick (with an instance or a refusal of its own) or sent a watch snapshot:
   * an outage is over, and the next pick asks rota.
   */
  #rotaAnswered(): void {
    this.#unreachableStreak = 0;
    this.#shortCutUntil = 0;
    if (this.#outageLogged) {
      this.#outageLogged = false;
      this.#logger.warn('rota: reachable again; picks come from rota');
    }
  }

  /** Picks from the cached list, or throws `failure` when the service was never seen. */
  #pickLocally(request: PickRequest__Output, failure: RotaError): PickResult {
    const service = request.service;
    if (!this.#cache.has(service)) {
      throw failure;
    }
    const local = this.#cache.pick(service, { version: request.version, exclude: request.exclude });
    if (local === undefined) {
      const version = request.version === '' ? ' without a version' : ` with version ${JSON.stringify(request.version)} nor without a version`;
      const excluded = request.exclude.length > 0 ? ' that is not excluded' : '';
      throw new RotaError(
        status.UNAVAILABLE,
        `service ${JSON.stringify(service)} has no UP instance${version}${excluded} (picked locally: rota is unreachable)`,
        { reason: NO_ELIGIBLE_INSTANCE },
      );
    }
    if (!this.#outageLogged) {
      this.#outageLogged = true;
      this.#logger.warn(
        `rota: unreachable (${failure.message}); picking locally from the cached instance lists until it answers ` +
          `again (first: ${service}/${local.instance.id} at ${local.instance.host}:${local.instance.port})`,
      );
    }
    return { ...local, rule: 'round_robin', localFallback: true };
  }

  /** Reports outcomes of calls made to picked instances (at most 1000 per call). */
  async report(outcomes: CallOutcome | readonly CallOutcome[]): Promise<ReportResult> {
    const list = Array.isArray(outcomes) ? (outcomes as readonly CallOutcome[]) : [outcomes as CallOutcome];
    const request = { outcomes: list.map(outcomeToMessage) };
    const response = await this.#unary<ReportResponse__Output>(
      (metadata, callOptions, callback) => this.#balancer.Report(request, metadata, callOptions, callback),
      this.#timeoutMs,
    );
    return { accepted: response.accepted, ignored: response.ignored };
  }

  /**
   * Calls `fn` with the picked instance, reports the outcome (`OK`, or the classified error)
   * with its latency, and returns `fn`'s result or rethrows its error. A failed report is
   * logged, never thrown; picks made locally are not reported.
   */
  async timed<T>(pick: PickResult, fn: (instance: Instance) => T | PromiseLike<T>, options: TimedOptions = {}): Promise<T> {
    const started = process.hrtime.bigint();
    let result: CallResult = 'OK';
    try {
      return await fn(pick.instance);
    } catch (error) {
      result = (options.classify ?? classifyError)(error);
      throw error;
    } finally {
      const latencyUs = Number((process.hrtime.bigint() - started) / 1000n);
      if (!pick.localFallback) {
        const outcome: CallOutcome = {
          service: pick.instance.service,
          instanceId: pick.instance.id,
          ticket: pick.ticket,
          rule: pick.rule,
          latencyUs,
          result,
        };
        await this.report(outcome).catch((error: unknown) => {
          this.#logger.warn(`rota: reporting a call outcome failed (${asRotaError(error).message})`);
        });
      }
    }
  }

  /**
   * Follows `service`: a background watch keeps its instance list, which `pick` falls back on
   * when rota cannot be reached. Resolves once the first list has arrived (or the client is
   * closed); rejects with `UNAVAILABLE` (`unreachable`) when it has not arrived within
   * `timeoutMs` (default `followTimeoutMs`, 5 s), e.g. while rota is down. The watch goes on
   * either way and reconnects by itself.
   */
  follow(service: string, options: { timeoutMs?: number } = {}): Promise<void> {
    if (this.#closing !== undefined) {
      return Promise.resolve();
    }
    const watcher = this.#watcher(service);
    const timeoutMs = options.timeoutMs ?? this.#followTimeoutMs;
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(
          new RotaError(
            status.UNAVAILABLE,
            `no instance list of "${service}" from rota at ${this.target} within ${timeoutMs} ms; still watching`,
            { unreachable: true },
          ),
        );
      }, timeoutMs);
      void watcher.ready.then(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  /** The watcher of `service`, started if it was not. */
  #watcher(service: string): ServiceWatcher {
    let watcher = this.#watchers.get(service);
    if (watcher === undefined) {
      watcher = new ServiceWatcher(service, this.#registry, this.#cache, this.#logger, this.#backoff, () =>
        this.#rotaAnswered(),
      );
      this.#watchers.set(service, watcher);
      watcher.start();
    }
    return watcher;
  }

  /** Stops following `service` and forgets its cached list. */
  unfollow(service: string): void {
    this.#watchers.get(service)?.close();
    this.#watchers.delete(service);
    this.#cache.delete(service);
  }

  /** The cached instance list of a followed service (what a local fallback pick chooses from), by id. */
  cachedInstances(service: string): Instance[] {
    return this.#cache.instances(service);
  }

  // ----- providers --------------------------------------------------------------------------

  /**
   * Registers instances on a new registration stream and resolves once rota has accepted them.
   * Rejects with a `RegistrationRefusedError` if any is refused (unless `allowPartial`).
   */
  async register(instances: InstanceSpec | readonly InstanceSpec[], options: RegistrationOptions = {}): Promise<Registration> {
    this.#ensureOpen();
    const list = Array.isArray(instances) ? (instances as readonly InstanceSpec[]) : [instances as InstanceSpec];
    const registration = await Registration.open(
      this.#registry,
      list,
      { backoff: this.#backoff, ...this.#registrationDefaults, ...options },
      this.#logger,
    );
    this.#registrations.add(registration);
    registration.once('close', () => this.#registrations.delete(registration));
    return registration;
  }

  // ----- registry views ---------------------------------------------------------------------

  async listServices(): Promise<ServiceSummary[]> {
    const response = await this.#unary<ListServicesResponse__Output>(
      (metadata, callOptions, callback) => this.#registry.ListServices({}, metadata, callOptions, callback),
      this.#timeoutMs,
    );
    return response.services.map((s) => ({ name: s.name, instances: s.instances, up: s.up, epoch: u64(s.epoch) }));
  }

  /** A service's instances, ordered by id. */
  async listInstances(service: string): Promise<InstanceList> {
    const response = await this.#unary<ListInstancesResponse__Output>(
      (metadata, callOptions, callback) => this.#registry.ListInstances({ service }, metadata, callOptions, callback),
      this.#timeoutMs,
    );
    return { instances: response.instances.map(instanceFromMessage), epoch: u64(response.epoch) };
  }

  /**
   * Watches a service: a snapshot first, then every change, until the loop is left
   * (`for await (const event of rota.watch('orders')) ...`).
   */
  async *watch(service: string): AsyncGenerator<WatchEvent, void, undefined> {
    this.#ensureOpen();
    const call = this.#registry.Watch({ service });
    call.on('error', () => {});
    try {
      for await (const message of call as AsyncIterable<WatchEvent__Output>) {
        const event = watchEventFromMessage(message);
        if (event !== undefined) {
          yield event;
        }
      }
    } catch (error) {
      throw asRotaError(error);
    } finally {
      call.cancel();
    }
  }

  // ----- lifecycle --------------------------------------------------------------------------

  /** Closes the registrations made through this client (withdrawing them), the watches and the connection. */
  close(): Promise<void> {
    this.#closing ??= this.#shutdown();
    return this.#closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  async #shutdown(): Promise<void> {
    await Promise.allSettled([...this.#registrations].map((registration) => registration.close()));
    this.#registrations.clear();
    for (const watcher of this.#watchers.values()) {
      watcher.close();
    }
    this.#watchers.clear();
    this.#channel.close();
  }

  #ensureOpen(): void {
    if (this.#closing !== undefined) {
      throw new RotaError(status.CANCELLED, 'the client is closed');
    }
  }

  #unary<T>(start: (metadata: Metadata, options: CallOptions, callback: Callback<T>) => unknown, timeoutMs: number): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.#ensureOpen();
      start(new Metadata(), { deadline: Date.now() + timeoutMs }, (error, value) => {
        if (error !== null && error !== undefined) {
          reject(RotaError.fromServiceError(error));
        } else {
          resolve(value as T);
        }
      });
    });
  }
}
