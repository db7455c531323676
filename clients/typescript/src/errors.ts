// Errors raised by the client.

import { Metadata, status, type ServiceError } from '@grpc/grpc-js';

import type { InstanceRef, Refusal } from './types.js';

/** The name of a gRPC status code, e.g. `"NOT_FOUND"`; `CODE_<n>` for a number that names none. */
export function codeName(code: status | number): string {
  return status[code] ?? `CODE_${code}`;
}

/** The trailer in which rota names why it refused a pick. */
export const REASON_KEY = 'rota-error';
/** The `reason` of a rota that started recently and has not seen the service yet. */
export const WARMING_UP = 'warming_up';
/** The `reason` of a pick with nothing eligible (also of a local pick). */
export const NO_ELIGIBLE_INSTANCE = 'no_eligible_instance';

/** The `rota-error` trailer of a failed call, `''` when there is none. */
export function errorReason(metadata: Metadata | undefined): string {
  const value = metadata?.get(REASON_KEY)[0];
  return typeof value === 'string' ? value : value === undefined ? '' : value.toString();
}

/**
 * A failed rota call: the gRPC status code and the server's message (`details`).
 *
 * `reason` is rota's stable token for a pick it refused (the `rota-error` trailer:
 * `no_eligible_instance`, `unknown_service`, `warming_up`, ...), empty when the failure did not
 * come from rota. `unreachable` tells a failure to reach rota (a transport failure, an expired
 * deadline; see `isUnreachable`) from an answer of rota's (for example `UNAVAILABLE` because no
 * instance is eligible, or `warming_up` after a restart).
 */
export class RotaError extends Error {
  override readonly name: string = 'RotaError';
  readonly code: status;
  readonly details: string;
  readonly metadata: Metadata;
  readonly reason: string;
  readonly unreachable: boolean;

  constructor(
    code: status,
    details: string,
    options: { metadata?: Metadata; reason?: string; unreachable?: boolean; cause?: unknown } = {},
  ) {
    super(`${codeName(code)}: ${details}`, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.details = details;
    this.metadata = options.metadata ?? new Metadata();
    this.reason = options.reason ?? errorReason(this.metadata);
    this.unreachable = options.unreachable ?? false;
  }

  /** The name of the status code, e.g. `"UNAVAILABLE"`. */
  get codeName(): string {
    return codeName(this.code);
  }

  /** Wraps a grpc-js call error. */
  static fromServiceError(error: ServiceError): RotaError {
    return new RotaError(error.code, error.details, {
      metadata: error.metadata,
      unreachable: isUnreachable(error),
      cause: error,
    });
  }
}

/**
 * True when rota could not be reached, as opposed to answering — the definition every client
 * shares (`clients/conformance/README.md`, "Unreachable"): `UNAVAILABLE` or `DEADLINE_EXCEEDED`
 * without rota's `rota-error` trailer (connection refused or dropped, deadline expired, a proxy
 * with no rota behind it). rota marks every pick failure it decides with that trailer,
 * `warming_up` included, so none of those is unreachable (see `fallsBack`).
 */
export function isUnreachable(error: Pick<ServiceError, 'code' | 'metadata'>): boolean {
  if (error.code !== status.UNAVAILABLE && error.code !== status.DEADLINE_EXCEEDED) {
    return false;
  }
  return errorReason(error.metadata) === '';
}

/** Whether a failed pick is answered by the local fallback: rota unreachable, or warming up. */
export function fallsBack(error: RotaError): boolean {
  return error.unreachable || error.reason === WARMING_UP;
}

/**
 * True when a gRPC call got no answer from its server at all: grpc-js made the status up itself
 * (connection refused or dropped, deadline expired), where an answer of the server always carries
 * its response headers (`content-type`), which grpc-js hands over with the status.
 */
export function neverAnswered(error: Pick<ServiceError, 'code' | 'metadata'>): boolean {
  if (error.code !== status.UNAVAILABLE && error.code !== status.DEADLINE_EXCEEDED) {
    return false;
  }
  return (error.metadata?.get('content-type').length ?? 0) === 0;
}

/** `register()` was refused for some of its instances (see `refused`); nothing stays registered. */
export class RegistrationRefusedError extends RotaError {
  override readonly name: string = 'RegistrationRefusedError';
  readonly accepted: InstanceRef[];
  readonly refused: Refusal[];

  constructor(accepted: InstanceRef[], refused: Refusal[]) {
    const first = refused[0];
    const summary = refused
      .map((refusal) => `${refusal.instance.service}/${refusal.instance.id}: ${refusal.message}`)
      .join('; ');
    super(first?.code ?? status.UNKNOWN, `registration refused: ${summary}`);
    this.accepted = accepted;
    this.refused = refused;
  }
}

export function asRotaError(error: unknown): RotaError {
  if (error instanceof RotaError) {
    return error;
  }
  if (isServiceError(error)) {
    return RotaError.fromServiceError(error);
  }
  const message = error instanceof Error ? error.message : String(error);
  return new RotaError(status.UNKNOWN, message, { cause: error });
}

function isServiceError(error: unknown): error is ServiceError {
  return error instanceof Error && typeof (error as Partial<ServiceError>).code === 'number' && 'details' in error;
}
