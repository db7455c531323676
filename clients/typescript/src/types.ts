// The library's public data types, and their conversion to and from the wire messages.

import type { status } from '@grpc/grpc-js';

import type { Ack__Output } from './generated/rota/v1/Ack.js';
import type { CallOutcome as CallOutcomeMessage } from './generated/rota/v1/CallOutcome.js';
import type { Instance as InstanceMessage, Instance__Output } from './generated/rota/v1/Instance.js';
import type { InstanceRef__Output } from './generated/rota/v1/InstanceRef.js';
import type { InstanceStatus__Output } from './generated/rota/v1/InstanceStatus.js';
import type { PickResponse__Output } from './generated/rota/v1/PickResponse.js';
import type { WatchEvent__Output } from './generated/rota/v1/WatchEvent.js';

/** `UP` instances get picks; `DRAINING` and `DOWN` ones stay registered but get none. */
export type InstanceStatus = 'UP' | 'DRAINING' | 'DOWN';

/** One instance of a service, as rota holds it. */
export interface Instance {
  /** Unique within the service ("host:port" when it was registered without one). */
  id: string;
  service: string;
  host: string;
  port: number;
  /** Empty when the instance has no version: it serves requests that carry none. */
  version: string;
  zone: string;
  /** 100 unless registered otherwise; 0 means never picked by weighted rules. */
  weight: number;
  metadata: Record<string, string>;
  status: InstanceStatus;
}

/** An instance to register. Only `service`, `host` and `port` are required. */
export interface InstanceSpec {
  service: string;
  host: string;
  port: number;
  /** Defaults to "host:port". */
  id?: string;
  version?: string;
  zone?: string;
  /** Defaults to 100. */
  weight?: number;
  metadata?: Record<string, string>;
  /** Defaults to `UP`. */
  status?: InstanceStatus;
}

/** Names one instance of one service. */
export interface InstanceRef {
  service: string;
  id: string;
}

/** Why one instance of a registration message was not applied. */
export interface Refusal {
  instance: InstanceRef;
  /** `INVALID_ARGUMENT`, `ALREADY_EXISTS`, `NOT_FOUND`, ... */
  code: status;
  message: string;
}

/** rota's answer to one announce, update or withdraw on a registration stream. */
export interface Ack {
  /** Identifies the registration stream's lease; a reconnected registration gets a new one. */
  leaseId: bigint;
  /** 1 for the first message of a stream, 2 for the next, ... */
  seq: bigint;
  accepted: InstanceRef[];
  refused: Refusal[];
  /** The stream is dropped after this long without a message. */
  heartbeatTimeoutMs: number;
}

/** Changes to one registered instance; fields left out keep their value. */
export interface InstanceUpdate {
  status?: InstanceStatus;
  weight?: number;
  /** Replaces all of the instance's metadata. */
  metadata?: Record<string, string>;
}

/** Everything in a pick request but the service. */
export interface PickOptions {
  /** Rule with optional parameters, e.g. `"repeat(n=3)"`. Defaults to round robin. */
  rule?: string;
  /**
   * The version this request wants. When left out, the current version of the async
   * context (see `withVersion`) applies; `""` asks for instances with no version.
   */
  version?: string;
  /** Affinity key for hashing rules. */
  key?: string;
  /** The consumer's zone, for zone-aware rules. */
  zone?: string;
  /** Instance ids already tried by this call; never returned. */
  exclude?: readonly string[];
  /** Deadline of this pick, overriding the client's `pickTimeoutMs`. */
  timeoutMs?: number;
}

/** The instance chosen by a pick, and how it was chosen. */
export interface PickResult {
  instance: Instance;
  /** The number drawn from the shared rotation counter for this pick (a 64-bit counter). */
  ticket: bigint;
  /** The rule that ran, in canonical form, e.g. `"repeat(n=3)"`. */
  rule: string;
  /** Empty when served as asked; otherwise why a fallback was taken (e.g. no instance of the version). */
  fallback: string;
  /** Generation of the service's instance list this pick was made from. */
  epoch: bigint;
  /**
   * True when rota could not be reached and the instance was picked by this process, round
   * robin over the last instance list seen through a watch of the service.
   */
  localFallback: boolean;
}

/** How a call to a picked instance went. */
export type CallResult = 'OK' | 'ERROR' | 'CONNECT_FAILURE';

/** The outcome of one call to a picked instance. */
export interface CallOutcome {
  service: string;
  instanceId: string;
  /** The ticket and rule of the pick the call followed, if any. */
  ticket?: bigint;
  rule?: string;
  /** How long the call took, in microseconds. */
  latencyUs: number;
  result: CallResult;
}

export interface ReportResult {
  /** Outcomes recorded. */
  accepted: number;
  /** Outcomes naming a service or instance that is not registered. */
  ignored: number;
}

export interface ServiceSummary {
  name: string;
  instances: number;
  up: number;
  epoch: bigint;
}

export interface InstanceList {
  /** Ordered by id. */
  instances: Instance[];
  epoch: bigint;
}

/** One event of a watch: a full snapshot first, then every change. */
export type WatchEvent =
  | { type: 'snapshot'; instances: Instance[]; epoch: bigint }
  | { type: 'added'; instance: Instance; epoch: bigint }
  | { type: 'updated'; instance: Instance; epoch: bigint }
  | { type: 'removed'; instance: InstanceRef; epoch: bigint };

// ---------------------------------------------------------------------------------------------
// Wire conversions (internal)
// ---------------------------------------------------------------------------------------------

const DEFAULT_WEIGHT = 100;

/**
 * A uint64 of a received message. The proto loader hands 64-bit integers over as decimal
 * strings (see `LOADER_OPTIONS` in proto.ts), so that no value above 2^53 loses precision.
 */
export function u64(value: string | number): bigint {
  return BigInt(value);
}

/** A bigint for a uint64 field of a message to send: the loader takes decimal strings. */
function u64ToMessage(value: bigint): string {
  if (value < 0n || value >= 1n << 64n) {
    throw new RangeError(`${value} does not fit a uint64`);
  }
  return value.toString();
}

export function instanceFromMessage(message: Instance__Output): Instance {
  return {
    id: message.id,
    service: message.service,
    host: message.host,
    port: message.port,
    version: message.version,
    zone: message.zone,
    weight: message.weight ?? DEFAULT_WEIGHT,
    metadata: { ...message.metadata },
    status: statusFromMessage(message.status),
  };
}

function statusFromMessage(status: InstanceStatus__Output): InstanceStatus {
  return status === 'INSTANCE_STATUS_UNSPECIFIED' ? 'UP' : status;
}

export function instanceToMessage(spec: InstanceSpec): InstanceMessage {
  const message: InstanceMessage = {
    id: spec.id ?? '',
    service: spec.service,
    host: spec.host,
    port: spec.port,
    version: spec.version ?? '',
    zone: spec.zone ?? '',
    metadata: { ...(spec.metadata ?? {}) },
    status: spec.status ?? 'UP',
  };
  if (spec.weight !== undefined) {
    message.weight = spec.weight;
  }
  return message;
}

/** The id rota gives an instance spec: its own, or "host:port". */
export function instanceId(spec: InstanceSpec): string {
  return spec.id !== undefined && spec.id !== '' ? spec.id : `${spec.host}:${spec.port}`;
}

export function refFromMessage(message: InstanceRef__Output | null): InstanceRef {
  return { service: message?.service ?? '', id: message?.id ?? '' };
}

export function ackFromMessage(message: Ack__Output): Ack {
  return {
    leaseId: u64(message.leaseId),
    seq: u64(message.seq),
    accepted: message.accepted.map(refFromMessage),
    // Refusal.code is the gRPC status code, which the wire carries as a plain number.
    // eslint-disable-next-line @typescript-eslint/no-unsafe-enum-assignment
    refused: message.refused.map((refusal) => ({
      instance: refFromMessage(refusal.instance),
      code: refusal.code,
      message: refusal.message,
    })),
    heartbeatTimeoutMs: Number(message.heartbeatTimeoutMs),
  };
}

export function pickResultFromMessage(message: PickResponse__Output): PickResult {
  if (message.instance === null) {
    throw new TypeError('rota answered a pick without an instance');
  }
  return {
    instance: instanceFromMessage(message.instance),
    ticket: u64(message.ticket),
    rule: message.rule,
    fallback: message.fallback,
    epoch: u64(message.epoch),
    localFallback: false,
  };
}

const CALL_RESULTS = {
  OK: 'CALL_RESULT_OK',
  ERROR: 'CALL_RESULT_ERROR',
  CONNECT_FAILURE: 'CALL_RESULT_CONNECT_FAILURE',
} as const;

export function outcomeToMessage(outcome: CallOutcome): CallOutcomeMessage {
  const result = CALL_RESULTS[outcome.result];
  if (result === undefined) {
    throw new TypeError(`unknown call result ${JSON.stringify(outcome.result)}`);
  }
  return {
    service: outcome.service,
    instanceId: outcome.instanceId,
    ticket: u64ToMessage(outcome.ticket ?? 0n),
    rule: outcome.rule ?? '',
    latencyUs: Math.max(0, Math.round(outcome.latencyUs)),
    result,
  };
}

export function watchEventFromMessage(message: WatchEvent__Output): WatchEvent | undefined {
  const epoch = u64(message.epoch);
  switch (message.event) {
    case 'snapshot':
      return { type: 'snapshot', instances: (message.snapshot?.instances ?? []).map(instanceFromMessage), epoch };
    case 'added':
      return message.added ? { type: 'added', instance: instanceFromMessage(message.added), epoch } : undefined;
    case 'updated':
      return message.updated ? { type: 'updated', instance: instanceFromMessage(message.updated), epoch } : undefined;
    case 'removed':
      return { type: 'removed', instance: refFromMessage(message.removed ?? null), epoch };
    default:
      return undefined;
  }
}
