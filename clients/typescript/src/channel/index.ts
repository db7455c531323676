// rota inside @grpc/grpc-js channels: importing this module registers the `rota` resolver
// scheme and the `rota` load-balancing policy, so that
//
//   new Client('rota:///orders', credentials.createInsecure())
//
// routes every call of the client by rota's rotation for the service "orders". Leases of
// consecutive tickets (Balancer.Lease) keep the rotation exact across every consumer while
// each call costs a local pick; see docs/channels.md.

import { registerLoadBalancerType, registerResolver } from '@grpc/grpc-js/build/src/experimental.js';

import { POLICY_NAME, RotaLoadBalancer, RotaLoadBalancingConfig } from './balancer.js';
import { RotaResolver } from './resolver.js';

export { POLICY_NAME, TICKET_HEADER, RotaLoadBalancingConfig } from './balancer.js';
export { LEASE_TARGET_MS, MAX_EXCLUDE, MAX_LEASE, MAX_VERSIONS, MIN_LEASE } from './lease.js';
export {
  ChannelToken,
  DEFAULT_SERVER,
  OPTION_BACKOFF,
  OPTION_LOGGER,
  OPTION_REPORT,
  OPTION_RULE,
  OPTION_SERVER,
  OPTION_TICKET_HEADER,
  OPTION_TLS_CA,
  OPTION_TLS_CERT,
  OPTION_TLS_KEY,
  OPTION_TOKEN,
  OPTION_VERSION,
  SERVER_ENV,
  rotaChannelOptions,
  rotaServer,
  type RotaChannelSettings,
} from './resolver.js';
export { TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TOKEN_ENV, type RotaAuthOptions } from '../rota-connection.js';

/** The target scheme: `rota:///SERVICE` or `rota://HOST:PORT/SERVICE`. */
export const SCHEME = 'rota';

let registered = false;

/** Registers the scheme and the policy with grpc-js (done on import; calling again is a no-op). */
export function registerChannel(): void {
  if (!registered) {
    registered = true;
    registerResolver(SCHEME, RotaResolver);
    registerLoadBalancerType(POLICY_NAME, RotaLoadBalancer, RotaLoadBalancingConfig);
  }
}

registerChannel();
