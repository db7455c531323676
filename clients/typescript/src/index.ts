// @rota/client: the TypeScript client of rota, the central load-balancing decision service.

export { DEFAULT_TARGET, RotaClient, TARGET_ENV, classifyError, type ConnectOptions, type RotaClientOptions, type TimedOptions } from './client.js';
export { TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TOKEN_ENV, type RotaAuthOptions } from './rota-connection.js';
export { Registration, type RegistrationEvents, type RegistrationOptions } from './registration.js';
export { RotaError, RegistrationRefusedError, codeName, isUnreachable } from './errors.js';
export { Backoff, type BackoffOptions } from './backoff.js';
export { InstanceCache, type LocalPick } from './fallback.js';
export { consoleLogger, type Logger } from './logger.js';
export {
  VERSION_HEADER,
  currentVersion,
  propagateVersion,
  versionFromHeaders,
  versionFromMetadata,
  versionHeaders,
  versionInterceptor,
  versionMetadata,
  versionMiddleware,
  withCallVersion,
  withVersion,
} from './version.js';
export type {
  Ack,
  CallOutcome,
  CallResult,
  Instance,
  InstanceList,
  InstanceRef,
  InstanceSpec,
  InstanceStatus,
  InstanceUpdate,
  PickOptions,
  PickResult,
  Refusal,
  ReportResult,
  ServiceSummary,
  WatchEvent,
} from './types.js';
export { status } from '@grpc/grpc-js';
