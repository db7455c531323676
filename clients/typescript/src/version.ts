// Version propagation: the version a request asks for (header `x-rota-version`) becomes the
// current version of its async context, and every pick made while handling it without an
// explicit version picks that version. Outgoing calls carry it on to the next service.

import { AsyncLocalStorage } from 'node:async_hooks';
import type { IncomingHttpHeaders } from 'node:http';

import { InterceptingCall, Metadata, type Interceptor } from '@grpc/grpc-js';

/** The HTTP header and gRPC metadata key carrying a request's version. */
export const VERSION_HEADER = 'x-rota-version';

const storage = new AsyncLocalStorage<string>();

/**
 * Runs `fn` with `version` as the current version (`undefined` or `""`: no version) and returns
 * its result. Everything `fn` starts, synchronously or not, sees that version.
 */
export function withVersion<T>(version: string | undefined, fn: () => T): T {
  return storage.run(version ?? '', fn);
}

/** The version of the current async context, or `undefined` when there is none. */
export function currentVersion(): string | undefined {
  const version = storage.getStore();
  return version === undefined || version === '' ? undefined : version;
}

/** The version named by HTTP request headers, if any. */
export function versionFromHeaders(headers: IncomingHttpHeaders): string | undefined {
  return firstNonEmpty(headers[VERSION_HEADER]);
}

/** The version named by incoming gRPC metadata, if any. */
export function versionFromMetadata(metadata: Metadata): string | undefined {
  return firstNonEmpty(metadata.get(VERSION_HEADER).map((value) => value.toString()));
}

function firstNonEmpty(value: string | readonly string[] | undefined): string | undefined {
  // Not Array.isArray, which narrows a readonly string[] to any[].
  const first = typeof value === 'object' ? value[0] : value;
  const trimmed = typeof first === 'string' ? first.trim() : '';
  return trimmed === '' ? undefined : trimmed;
}

/**
 * HTTP middleware (Express, Connect, or plain `node:http` with a `next` callback): runs the rest
 * of the request's handling with the version of its `x-rota-version` header as the current one.
 */
export function versionMiddleware(
  req: { headers: IncomingHttpHeaders },
  _res: unknown,
  next: (error?: unknown) => void,
): void {
  withVersion(versionFromHeaders(req.headers), () => next());
}

/** What every grpc-js server handler receives first: the call, carrying its metadata. */
interface ServerCallLike {
  metadata: Metadata;
}

/**
 * Wraps a grpc-js server handler (unary or streaming) so that it runs with the version of the
 * call's `x-rota-version` metadata as the current one.
 */
export function withCallVersion<H extends (call: ServerCallLike, ...rest: never[]) => unknown>(handler: H): H {
  const wrapped = function (this: unknown, call: ServerCallLike, ...rest: never[]): unknown {
    return withVersion(versionFromMetadata(call.metadata), () => handler.call(this, call, ...rest));
  };
  return wrapped as H;
}

/**
 * Wraps every handler of a grpc-js service implementation with `withCallVersion`:
 * `server.addService(Service.service, propagateVersion({ ... }))`.
 */
export function propagateVersion<T extends object>(implementation: T): T {
  const wrapped: Record<string, unknown> = {};
  for (const [name, handler] of Object.entries(implementation)) {
    wrapped[name] = typeof handler === 'function' ? withCallVersion(handler as (call: ServerCallLike) => unknown) : handler;
  }
  return wrapped as T;
}

/** HTTP headers for an outgoing request: `headers` plus `x-rota-version` when there is a current version. */
export function versionHeaders(headers: Record<string, string> = {}): Record<string, string> {
  const version = currentVersion();
  return version === undefined ? { ...headers } : { ...headers, [VERSION_HEADER]: version };
}

/** Adds the current version (if any, and unless already set) to outgoing gRPC metadata. */
export function versionMetadata(metadata: Metadata = new Metadata()): Metadata {
  const version = currentVersion();
  if (version !== undefined && metadata.get(VERSION_HEADER).length === 0) {
    metadata.set(VERSION_HEADER, version);
  }
  return metadata;
}

/**
 * A grpc-js client interceptor that sends the current version with every outgoing call:
 * `new SomeClient(target, credentials, { interceptors: [versionInterceptor] })`.
 */
export const versionInterceptor: Interceptor = (options, nextCall) => {
  // The version is read when the call is made, in the caller's context.
  const version = currentVersion();
  return new InterceptingCall(nextCall(options), {
    start(metadata, listener, next) {
      if (version !== undefined && metadata.get(VERSION_HEADER).length === 0) {
        metadata.set(VERSION_HEADER, version);
      }
      next(metadata, listener);
    },
  });
};
