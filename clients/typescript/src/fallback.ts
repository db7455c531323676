// The last instance lists seen through watches, and the local round robin over them that
// answers picks while rota cannot be reached.

import type { Instance, InstanceRef } from './types.js';

/** A pick made from the cache. */
export interface LocalPick {
  instance: Instance;
  /** This process's own rotation counter for the subset picked from. */
  ticket: bigint;
  /** Why a version fallback was taken, as rota words it; empty when served as asked. */
  fallback: string;
  /** Epoch of the cached instance list. */
  epoch: bigint;
}

interface CachedService {
  instances: Map<string, Instance>;
  epoch: bigint;
}

/** Per-service instance lists, fed by watch events. */
export class InstanceCache {
  readonly #services = new Map<string, CachedService>();
  readonly #counters = new Map<string, bigint>();

  /** Replaces a service's whole list (a watch snapshot). */
  replace(service: string, instances: readonly Instance[], epoch: bigint): void {
    this.#services.set(service, { instances: new Map(instances.map((i) => [i.id, i])), epoch });
  }

  /** Adds or replaces one instance (a watch `added` or `updated` event). */
  upsert(instance: Instance, epoch: bigint): void {
    const cached = this.#entry(instance.service);
    cached.instances.set(instance.id, instance);
    cached.epoch = epoch;
  }

  /** Removes one instance (a watch `removed` event). */
  remove(ref: InstanceRef, epoch: bigint): void {
    const cached = this.#entry(ref.service);
    cached.instances.delete(ref.id);
    cached.epoch = epoch;
  }

  has(service: string): boolean {
    return this.#services.has(service);
  }

  /** Forgets a service. */
  delete(service: string): void {
    this.#services.delete(service);
    const prefix = `${service}\0`;
    for (const key of this.#counters.keys()) {
      if (key.startsWith(prefix)) {
        this.#counters.delete(key);
      }
    }
  }

  /** The cached instances of a service, ordered by id; empty if the service is not cached. */
  instances(service: string): Instance[] {
    const cached = this.#services.get(service);
    return cached === undefined ? [] : sortedById([...cached.instances.values()]);
  }

  epoch(service: string): bigint {
    return this.#services.get(service)?.epoch ?? 0n;
  }

  /**
   * Round robin as the conformance README's local fallback contract says: version isolation
   * first (a version V gets the `UP` instances of version V, or when there are none the `UP`
   * instances with no version; no version gets the `UP` instances with no version); ticket `t`
   * (0, 1, 2, ... per service and subset) takes position `t mod k` among the k instances of that
   * subset (by id) that are not excluded, as rota's round robin does. Exclusion never sends
   * a versioned pick to the unversioned instances. `undefined` when the subset is empty or all
   * excluded (or the service is not cached; see `has`).
   */
  pick(service: string, options: { version?: string; exclude?: readonly string[] } = {}): LocalPick | undefined {
    const cached = this.#services.get(service);
    if (cached === undefined) {
      return undefined;
    }
    const version = options.version ?? '';
    const up = sortedById([...cached.instances.values()]).filter((i) => i.status === 'UP');
    let subset = up.filter((i) => i.version === version);
    let subsetVersion = version;
    let fallback = '';
    if (subset.length === 0 && version !== '') {
      subset = up.filter((i) => i.version === '');
      subsetVersion = '';
      fallback = `no instance with version ${JSON.stringify(version)}; picked from instances with no version`;
    }
    const excluded = new Set(options.exclude ?? []);
    const accepted = subset.filter((i) => !excluded.has(i.id));
    if (accepted.length === 0) {
      return undefined;
    }
    const key = `${service}\0${subsetVersion}`;
    const ticket = this.#counters.get(key) ?? 0n;
    this.#counters.set(key, ticket + 1n);
    const instance = accepted[Number(ticket % BigInt(accepted.length))] as Instance;
    return { instance, ticket, fallback, epoch: cached.epoch };
  }

  #entry(service: string): CachedService {
    let cached = this.#services.get(service);
    if (cached === undefined) {
      cached = { instances: new Map(), epoch: 0n };
      this.#services.set(service, cached);
    }
    return cached;
  }
}

function sortedById(instances: Instance[]): Instance[] {
  return instances.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}
