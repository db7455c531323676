// The `rota` resolver scheme: `rota://HOST:PORT/SERVICE`, or `rota:///SERVICE` with rota's
// address from the channel option `rota.server`, else ROTA_SERVER, else 127.0.0.1:50051. It
// follows the service with Watch and hands its UP instances to the channel.

import { Metadata, credentials, status, type ChannelOptions, type ClientReadableStream, type ServiceError } from '@grpc/grpc-js';
import {
  type Endpoint,
  type GrpcUri,
  type Resolver,
  type ResolverListener,
} from '@grpc/grpc-js/build/src/experimental.js';

import type { BackoffOptions } from '../backoff.js';
import { Backoff } from '../backoff.js';
import type { Instance__Output } from '../generated/rota/v1/Instance.js';
import type { WatchEvent__Output } from '../generated/rota/v1/WatchEvent.js';
import { consoleLogger, type Logger } from '../logger.js';
import { bareTarget, rotaConnection, type RotaAuthOptions, type RotaConnection } from '../rota-connection.js';
import { RotaLink } from './link.js';

/** Channel options read by the rota resolver and policy. */
export const OPTION_SERVER = 'rota.server';
export const OPTION_RULE = 'rota.rule';
export const OPTION_VERSION = 'rota.version';
/** `false` turns off the reporting of call outcomes. */
export const OPTION_REPORT = 'rota.report';
/** `true` adds each call's ticket as `x-rota-ticket` metadata (off by default). */
export const OPTION_TICKET_HEADER = 'rota.ticket_header';
export const OPTION_LOGGER = 'rota.logger';
export const OPTION_BACKOFF = 'rota.backoff';
/**
 * The connection to rota: a bearer token, and PEM files of the CA that signed rota's certificate
 * (TLS) and of a client certificate and its key (mTLS); each defaults to its environment variable
 * (ROTA_TOKEN, ROTA_TLS_CA, ROTA_TLS_CERT, ROTA_TLS_KEY). See {@link rotaChannelOptions}.
 */
export const OPTION_TOKEN = 'rota.token';
export const OPTION_TLS_CA = 'rota.tls_ca';
export const OPTION_TLS_CERT = 'rota.tls_cert';
export const OPTION_TLS_KEY = 'rota.tls_key';
/** The attribute that hands the channel's rota link from the resolver to the policy. */
export const LINK_ATTRIBUTE = 'rota.link';
export const SERVER_ENV = 'ROTA_SERVER';
/** rota's answers to a Watch that no retry changes: the channel's calls fail with them. */
const REFUSING_CODES = new Set<status>([status.UNAUTHENTICATED, status.PERMISSION_DENIED]);
/** rota's address when neither the target, the channel option nor ROTA_SERVER names one. */
export const DEFAULT_SERVER = '127.0.0.1:50051';

/**
 * rota's address for a channel: the target's authority (`rota://HOST:PORT/SERVICE`), else the
 * channel option `rota.server`, else the ROTA_SERVER environment variable, else
 * {@link DEFAULT_SERVER}. Empty values count as absent.
 */
export function rotaServer(authority: string, options: ChannelOptions, env: NodeJS.ProcessEnv = process.env): string {
  const option: unknown = options[OPTION_SERVER];
  return authority || (typeof option === 'string' ? option : '') || env[SERVER_ENV] || DEFAULT_SERVER;
}

/**
 * A token as a channel option that grpc-js's channel trace (`GRPC_TRACE=channel`, which prints the
 * channel options as JSON) shows as `(rota token)`; {@link rotaChannelOptions} wraps the token in
 * one. A plain string is taken too.
 */
export class ChannelToken {
  readonly #value: string;

  constructor(value: string) {
    this.#value = value;
  }

  get value(): string {
    return this.#value;
  }

  toJSON(): string {
    return '(rota token)';
  }
}

/** The rota channel options, typed; {@link rotaChannelOptions} turns them into grpc-js channel options. */
export interface RotaChannelSettings extends RotaAuthOptions {
  /** rota's `HOST:PORT` (or `https://HOST:PORT`) for a `rota:///SERVICE` target. */
  server?: string;
  /** The rule leased (`round_robin`, `repeat(n=N)`, `weighted`). */
  rule?: string;
  /** The version of calls that name none. */
  version?: string;
  /** `true` adds each call's ticket as `x-rota-ticket`. */
  ticketHeader?: boolean;
}

/**
 * grpc-js channel options for a `rota:///SERVICE` channel:
 *
 * ```ts
 * new Echo('rota:///orders', credentials.createInsecure(), rotaChannelOptions({ token, tlsCa }))
 * ```
 *
 * The channel credentials apply to the instances; these options to the connection to rota.
 */
export function rotaChannelOptions(settings: RotaChannelSettings): ChannelOptions {
  const entries: [string, string | boolean | ChannelToken | undefined][] = [
    [OPTION_SERVER, settings.server],
    [OPTION_RULE, settings.rule],
    [OPTION_VERSION, settings.version],
    [OPTION_TICKET_HEADER, settings.ticketHeader],
    [OPTION_TOKEN, settings.token === undefined ? undefined : new ChannelToken(settings.token)],
    [OPTION_TLS_CA, settings.tlsCa],
    [OPTION_TLS_CERT, settings.tlsCert],
    [OPTION_TLS_KEY, settings.tlsKey],
  ];
  return Object.fromEntries(entries.filter(([, value]) => value !== undefined));
}

/** The token and TLS channel options, as {@link rotaConnection} takes them. */
function authOptions(options: ChannelOptions): RotaAuthOptions {
  const text = (key: string): string | undefined => {
    const value: unknown = options[key];
    return typeof value === 'string' ? value : undefined;
  };
  const token: unknown = options[OPTION_TOKEN];
  return { token: token instanceof ChannelToken ? token.value : text(OPTION_TOKEN), tlsCa: text(OPTION_TLS_CA), tlsCert: text(OPTION_TLS_CERT), tlsKey: text(OPTION_TLS_KEY) };
}

/** What the policy needs to know of an instance, by "host:port". */
export interface KnownInstance {
  id: string;
  addr: string;
  version: string;
  weight: number;
}

/** The link plus the resolver's current instance list. */
export interface ResolvedService {
  link: RotaLink;
  /** Counts Watch streams: a new one may follow a restarted rota, whose counters started over. */
  watch: number;
  instances: readonly KnownInstance[];
}

export class RotaResolver implements Resolver {
  readonly #listener: ResolverListener;
  readonly #link: RotaLink;
  readonly #serviceConfig: { loadBalancingConfig: object[]; methodConfig: [] } | null;
  readonly #backoff: Backoff;
  readonly #instances = new Map<string, Instance__Output>();
  #call: ClientReadableStream<WatchEvent__Output> | undefined;
  #retry: NodeJS.Timeout | undefined;
  #published = false;
  #watches = 0;
  #lost = false;
  #destroyed = false;

  static getDefaultAuthority(target: GrpcUri): string {
    return target.path.replace(/^\//, '');
  }

  constructor(target: GrpcUri, listener: ResolverListener, options: ChannelOptions) {
    this.#listener = listener;
    const service = target.path.replace(/^\//, '');
    const server = rotaServer(target.authority ?? '', options);
    const logger = (options[OPTION_LOGGER] as Logger | undefined) ?? consoleLogger;
    const backoff = (options[OPTION_BACKOFF] as BackoffOptions | undefined) ?? { initialMs: 100, maxMs: 2_000 };
    this.#backoff = new Backoff(backoff);
    let connection: RotaConnection;
    let unusable = '';
    try {
      connection = rotaConnection(server, authOptions(options));
    } catch (error) {
      unusable = (error as Error).message;
      connection = { target: bareTarget(server), credentials: credentials.createInsecure(), token: undefined, interceptors: [] };
    }
    this.#link = new RotaLink(connection.target, service, logger, backoff, connection);
    // A service config given to the channel (grpc.service_config) wins; otherwise the policy is
    // rota with the rule and version of the channel options.
    this.#serviceConfig =
      options['grpc.service_config'] !== undefined
        ? null
        : {
            loadBalancingConfig: [
              {
                rota: {
                  rule: (options[OPTION_RULE] as string | undefined) ?? '',
                  version: (options[OPTION_VERSION] as string | undefined) ?? '',
                  report: options[OPTION_REPORT] !== false,
                  ticketHeader: options[OPTION_TICKET_HEADER] === true,
                },
              },
            ],
            methodConfig: [],
          };
    if (service === '' || unusable !== '') {
      const details = unusable || `rota: target names no service (want rota:///SERVICE)`;
      process.nextTick(() => this.#fail(details));
      this.#destroyed = true;
      return;
    }
    this.#watch();
  }

  updateResolution(): void {}

  destroy(): void {
    this.#destroyed = true;
    clearTimeout(this.#retry);
    this.#call?.cancel();
    this.#link.close();
  }

  #watch(): void {
    if (this.#destroyed) {
      return;
    }
    const call = this.#link.registry.Watch({ service: this.#link.service });
    this.#call = call;
    let first = true;
    call.on('data', (event: WatchEvent__Output) => {
      if (this.#call !== call) {
        return;
      }
      switch (event.event) {
        case 'snapshot':
          this.#instances.clear();
          for (const i of event.snapshot?.instances ?? []) {
            this.#instances.set(i.id, i);
          }
          break;
        case 'added':
          this.#instances.set(event.added!.id, event.added!);
          break;
        case 'updated':
          this.#instances.set(event.updated!.id, event.updated!);
          break;
        case 'removed':
          this.#instances.delete(event.removed!.id);
          break;
      }
      if (first) {
        first = false;
        this.#watches++;
        this.#backoff.reset();
        if (this.#lost) {
          this.#lost = false;
          this.#link.logger.warn(`rota: watching "${this.#link.service}" again`);
        }
      }
      this.#publish(event.epoch);
    });
    call.on('error', (error: ServiceError) => this.#ended(call, error.details, REFUSING_CODES.has(error.code) ? error.code : undefined));
    call.on('end', () => this.#ended(call, 'the watch ended'));
  }

  /** `refusal`: rota refused the watch itself (the token), and the channel's calls fail with its status and message. */
  #ended(call: ClientReadableStream<WatchEvent__Output>, reason: string, refusal?: status): void {
    if (this.#call !== call || this.#destroyed) {
      return;
    }
    this.#call = undefined;
    // Tickets leased before now may be a restarted rota's to give out again: the policy drops
    // them and leases afresh (or rotates locally while rota is away).
    this.#link.watchLost();
    if (!this.#lost) {
      this.#lost = true;
      this.#link.logger.warn(`rota: watch of "${this.#link.service}" lost (${reason}); routing over the last known instances`);
    }
    if (!this.#published) {
      if (refusal !== undefined) {
        this.#fail(reason, refusal);
      } else {
        this.#fail(`rota: cannot watch service "${this.#link.service}" at ${this.#link.server}: ${reason}`);
      }
    }
    this.#retry = setTimeout(() => this.#watch(), this.#backoff.next());
    this.#retry.unref();
  }

  #fail(details: string, code: status = status.UNAVAILABLE): void {
    this.#listener({ ok: false, error: { code, details, metadata: new Metadata() } }, {}, null, details);
  }

  #publish(epoch: string): void {
    const up = [...this.#instances.values()]
      .filter((i) => i.status === 'UP' || i.status === 'INSTANCE_STATUS_UNSPECIFIED')
      .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    if (up.length === 0) {
      this.#published = false;
      this.#fail(`rota: service "${this.#link.service}" has no UP instance (epoch ${epoch}); is it registered with rota?`);
      return;
    }
    this.#published = true;
    const endpoints: Endpoint[] = up.map((i) => ({ addresses: [{ host: i.host, port: i.port }] }));
    const resolved: ResolvedService = {
      link: this.#link,
      watch: this.#watches,
      instances: up.map((i) => ({ id: i.id, addr: hostPortOf(i), version: i.version, weight: i.weight ?? 100 })),
    };
    this.#listener(
      { ok: true, value: endpoints },
      { [LINK_ATTRIBUTE]: resolved },
      this.#serviceConfig === null ? null : { ok: true, value: this.#serviceConfig as never },
      '',
    );
  }
}

function hostPortOf(i: Instance__Output): string {
  return i.host.includes(':') && !i.host.startsWith('[') ? `[${i.host}]:${i.port}` : `${i.host}:${i.port}`;
}
