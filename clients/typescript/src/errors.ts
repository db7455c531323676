// Errors raised by the client.

import { Metadata, status, type ServiceError } from '@grpc/grpc-js';

import type { InstanceRef, Refusal } from './types.js';

/** The name of a gRPC status code, e.g. `"NOT_FOUND"`. */
export function codeName(code: status): string {
  return status[code] ?? `CODE_${code}`;
}

/**
 * A failed rota call: the gRPC status code and the server's message (`details`).
 *
 * `unreachable` tells a transport failure or an expired deadline (rota was not reached or did
 * not answer in time) from an answer of rota's (for example `UNAVAILABLE` because no instance
 * is eligible).
 */
export class RotaError extends Error {
  override readonly name: string = 'RotaError';
  readonly code: status;
  readonly details: string;
  readonly metadata: Metadata;
  readonly unreachable: boolean;

  constructor(
    code: status,
    details: string,
    options: { metadata?: Metadata; unreachable?: boolean; cause?: unknown } = {},
  ) {
    super(`${codeName(code)}: ${details}`, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.details = details;
    this.metadata = options.metadata ?? new Metadata();
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
 * True when a call failed without an answer from rota: grpc-js made up the status itself
 * (connection refused or dropped, deadline expired). An answer of the server always carries
 * its response headers (`content-type`), which grpc-js hands over with the status.
 */
export function isUnreachable(error: Pick<ServiceError, 'code' | 'metadata'>): boolean {
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
