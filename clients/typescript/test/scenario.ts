// What the channel scenario runner (channel.test.ts) and the xDS scenario runner (xds.test.ts)
// share: the fleet a scenario runs against (a `rota serve`, one echo server and one registration
// per instance), the scenario's policy in proto JSON, the check of unknown keys and the
// expectations of a `calls` step (clients/conformance/channel/README.md).

import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { join } from 'node:path';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

import { RotaClient, type Registration } from '../src/index.js';
import { rotaV1 } from '../src/proto.js';
import { EchoServer, type EchoCall, type EchoResult } from './echo.js';
import { RotaServer, repoRoot, silentLogger, waitFor } from './harness.js';
import { weightedCycle, oraclePosition } from './oracle.js';

export interface Expect {
  failures?: number;
  error_contains?: string;
  leased?: boolean;
  rotation?: string[];
  runs?: number;
  only?: string[];
  never?: string[];
  spread?: boolean;
  counts?: Record<string, number>;
  balanced?: boolean;
  reported?: boolean;
}

export function checkKeys(what: string, value: unknown, allowed: ReadonlySet<string>): void {
  if (value === undefined) {
    return;
  }
  assert.ok(value !== null && typeof value === 'object' && !Array.isArray(value), `${what} is not an object`);
  for (const key of Object.keys(value)) {
    assert.ok(allowed.has(key), `unknown key ${JSON.stringify(key)} in ${what} (known: ${[...allowed].sort().join(', ')})`);
  }
}

type MessageType = { field: { name: string; type: string; typeName: string; label: string }[]; nestedType: { name: string; field: { name: string; type: string; typeName: string }[]; options: { mapEntry?: boolean } | null }[] };

let rotaTypes: Record<string, { type?: MessageType }> | undefined;

function messageType(name: string): MessageType {
  rotaTypes ??= protoLoader.loadSync(join('rota', 'v1', 'rota.proto'), { includeDirs: [join(repoRoot, 'proto')], keepCase: false }) as unknown as Record<string, { type?: MessageType }>;
  const type = rotaTypes[`rota.v1.${name}`]?.type;
  assert.ok(type !== undefined, `no message rota.v1.${name}`);
  return type;
}

/**
 * A message in proto JSON (lowerCamelCase or proto field names, enums by name) as the object
 * grpc-js sends: field names in camelCase, map keys as they are. An unknown field fails.
 */
function fromProtoJson(typeName: string, json: unknown, path: string): Record<string, unknown> {
  const type = messageType(typeName);
  assert.ok(json !== null && typeof json === 'object' && !Array.isArray(json), `${path} is not an object`);
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(json as Record<string, unknown>)) {
    const name = key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());
    const field = type.field.find((f) => f.name === name);
    assert.ok(field !== undefined, `unknown key ${JSON.stringify(key)} in ${path} (rota.v1.${typeName} has ${type.field.map((f) => f.name).join(', ')})`);
    if (field.type !== 'TYPE_MESSAGE') {
      out[name] = value;
      continue;
    }
    const entry = type.nestedType.find((n) => n.name === field.typeName && n.options?.mapEntry === true);
    if (entry !== undefined) {
      const valueType = entry.field.find((f) => f.name === 'value')!;
      assert.ok(value !== null && typeof value === 'object' && !Array.isArray(value), `${path}.${key} is not an object`);
      out[name] = Object.fromEntries(
        Object.entries(value as Record<string, unknown>).map(([k, v]) => [k, valueType.type === 'TYPE_MESSAGE' ? fromProtoJson(valueType.typeName, v, `${path}.${key}.${k}`) : v]),
      );
    } else if (field.label === 'LABEL_REPEATED') {
      assert.ok(Array.isArray(value), `${path}.${key} is not a list`);
      out[name] = value.map((v, i) => fromProtoJson(field.typeName, v, `${path}.${key}[${i}]`));
    } else {
      out[name] = fromProtoJson(field.typeName, value, `${path}.${key}`);
    }
  }
  return out;
}

/** A scenario's `policy` as a SetPolicy request's Policy (the service is the scenario's). */
export function policyMessage(policy: Record<string, unknown>): Record<string, unknown> {
  assert.ok(!('service' in policy), 'policy names its service: the scenario sets it for its own');
  return fromProtoJson('Policy', policy, 'policy');
}

export async function setPolicy(target: string, service: string, policy: Record<string, unknown>): Promise<void> {
  const policies = new (rotaV1().Policies)(target, grpc.credentials.createInsecure());
  try {
    await new Promise<void>((resolve, reject) => {
      policies.SetPolicy({ policy: { ...policyMessage(policy), service } }, { deadline: Date.now() + 5_000 }, (error: grpc.ServiceError | null) =>
        error !== null ? reject(new Error(`SetPolicy of ${service}: ${error.details}`)) : resolve(),
      );
    });
  } finally {
    policies.close();
  }
}

function sortedRecord(r: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.entries(r).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

/**
 * `rotation` over calls: every call carried a ticket, none of the `drawn` tickets drawn out of
 * band before the step (0..drawn-1), none used twice, and each reached the instance the rule
 * maps its ticket to over `rotation` in id order.
 */
export function checkRotation(rule: string, rotation: readonly string[], weights: ReadonlyMap<string, number>, calls: readonly EchoCall[], drawn: bigint): void {
  const ids = [...rotation].sort();
  const w = ids.map((id) => weights.get(id) ?? 100);
  // The rule's mapping over `rotation` (test/oracle.ts), the schedule of weighted built once.
  const cycle = rule === 'weighted' ? weightedCycle(w) : undefined;
  const expected = (ticket: bigint): string => ids[cycle !== undefined ? cycle[Number(ticket % BigInt(cycle.length))]! : oraclePosition(rule, w, ticket)]!;
  const seen = new Map<bigint, string>();
  for (const c of calls) {
    assert.ok(c.ticket >= 0n, `a call to ${c.instance} carried no ticket`);
    assert.ok(c.ticket >= drawn, `a call to ${c.instance} carried ticket ${c.ticket}, one of the ${drawn} tickets drawn out of band before the step`);
    assert.ok(!seen.has(c.ticket), `ticket ${c.ticket} was used twice (${seen.get(c.ticket)} and ${c.instance}): no shared rotation`);
    seen.set(c.ticket, c.instance);
    assert.equal(c.instance, expected(c.ticket), `ticket ${c.ticket}`);
  }
  assert.ok(seen.size > 0, 'no call to check');
}

/**
 * Leases `count` tickets of a service's rotation under `rule`, without a version, with the
 * generated Balancer stub on a client of its own: neither the client library nor a channel
 * under test takes part. Resolves to the number of tickets leased.
 */
export async function drawOutOfBand(target: string, service: string, rule: string, count: number): Promise<number> {
  const balancer = new (rotaV1().Balancer)(target, grpc.credentials.createInsecure());
  try {
    return await new Promise<number>((resolve, reject) => {
      balancer.Lease({ service, rule, count }, { deadline: Date.now() + 10_000 }, (error, response) => {
        if (error !== null || response === undefined) {
          reject(new Error(`Lease of ${count} tickets of ${service}: ${error?.details ?? 'no response'}`));
        } else if (response.count !== count || response.picks.length > 0) {
          reject(new Error(`rota leased ${response.count} tickets (${response.picks.length} picks), not ${count}`));
        } else {
          resolve(count);
        }
      });
    });
  } finally {
    balancer.close();
  }
}

/** Checks a calls step's expectations; `drawn` is the number of tickets drawn out of band before the step. */
export function checkExpect(rule: string, e: Expect | undefined, weights: ReadonlyMap<string, number>, results: EchoResult[], calls: EchoCall[], drawn = 0n): void {
  if (e === undefined) {
    return;
  }
  const failed = results.filter((r) => r.error !== undefined);
  const reached = results.flatMap((r) => (r.instance !== undefined ? [r.instance] : []));
  if (e.failures !== undefined) {
    const kinds = new Map<string, number>();
    for (const r of failed) {
      kinds.set(r.error!.details, (kinds.get(r.error!.details) ?? 0) + 1);
    }
    assert.equal(failed.length, e.failures, `failures: ${[...kinds].map(([details, n]) => `${n} × ${details}`).join('; ')}`);
  }
  if (e.error_contains !== undefined) {
    for (const r of failed) {
      assert.ok(r.error!.details.includes(e.error_contains), `${r.error!.details} does not mention ${e.error_contains}`);
    }
  }
  assert.equal(calls.length, reached.length, 'calls answered by the instances vs answers seen');
  for (const id of reached) {
    if (e.only !== undefined) {
      assert.ok(e.only.includes(id), `a call reached ${id}, outside ${e.only.join(',')}`);
    }
    assert.ok(!(e.never ?? []).includes(id), `a call reached ${id}`);
  }
  if (e.spread) {
    for (const id of e.only ?? []) {
      assert.ok(reached.includes(id), `${id} answered no call`);
    }
  }
  if (e.counts !== undefined) {
    const got: Record<string, number> = {};
    for (const id of reached) {
      got[id] = (got[id] ?? 0) + 1;
    }
    const want = Object.fromEntries(Object.entries(e.counts).filter(([, n]) => n > 0));
    assert.deepEqual(sortedRecord(got), sortedRecord(want), 'calls per instance');
  }
  if (e.balanced) {
    const got = new Map<string, number>((e.only ?? [...new Set(reached)]).map((id) => [id, 0]));
    for (const id of reached) {
      got.set(id, (got.get(id) ?? 0) + 1);
    }
    const counts = [...got.values()];
    const bound = Math.max(2, Math.floor(reached.length / 10));
    const shares = [...got].map(([id, n]) => `${id} ${n}`).join(', ');
    assert.ok(counts.every((n) => n > 0), `balanced: an instance answered no call (${shares})`);
    assert.ok(Math.max(...counts) - Math.min(...counts) <= bound, `balanced: ${shares} differ by more than ${bound}`);
  }
  if (e.leased !== undefined) {
    for (const c of calls) {
      assert.equal(c.ticket >= 0n, e.leased, `call to ${c.instance} with ticket ${c.ticket}`);
    }
  }
  if (e.rotation !== undefined) {
    checkRotation(rule, e.rotation, weights, calls, drawn);
  }
  if (e.runs !== undefined) {
    const n = BigInt(e.runs);
    const groups = new Map<bigint, string[]>();
    for (const c of calls) {
      const g = c.ticket / n;
      groups.set(g, [...(groups.get(g) ?? []), c.instance]);
    }
    let complete = 0;
    for (const [g, members] of groups) {
      if (members.length === e.runs) {
        complete++;
        assert.equal(new Set(members).size, 1, `tickets ${g * n}..${g * n + n - 1n} reached ${members.join(',')}`);
      }
    }
    assert.ok(complete > 0, `no complete run of ${e.runs}`);
  }
}

/** Bounds of `reported`'s poll of rota's admin API. */
const REPORTED_WITHIN_MS = 10_000;
const REPORTED_EVERY_MS = 75;

/**
 * The `reported` expectation: polls rota's admin API (`GET /api/services/echo`) until every
 * instance of the scenario shows as many calls as its echo server answered since the scenario
 * started (`answered`, every call of the fleet's log) and no error; resolves with those counts,
 * or fails with both numbers per id after 10 s.
 */
export async function checkReported(admin: string | undefined, instances: readonly ScenarioInstance[], answered: readonly EchoCall[]): Promise<Record<string, number>> {
  assert.ok(admin !== undefined, "reported: rota's admin listener is off");
  const want: Record<string, number> = Object.fromEntries(instances.map((inst) => [inst.id, 0]));
  for (const c of answered) {
    want[c.instance] = (want[c.instance] ?? 0) + 1;
  }
  const url = `http://${admin}/api/services/echo`;
  const deadline = Date.now() + REPORTED_WITHIN_MS;
  for (;;) {
    const polled = Date.now();
    const got = new Map<string, { calls: number; errors: number }>();
    let problem: string | undefined;
    try {
      const response = await fetch(url, { signal: AbortSignal.timeout(2_000) });
      const body = await response.text();
      if (!response.ok) {
        problem = `GET ${url}: ${response.status} ${body}`;
      } else {
        const view = JSON.parse(body) as { instances: { id: string; calls: number; errors: number }[] };
        for (const inst of view.instances) {
          got.set(inst.id, { calls: inst.calls, errors: inst.errors });
        }
      }
    } catch (error) {
      problem = `GET ${url}: ${(error as Error).message}`;
    }
    if (problem === undefined && Object.entries(want).every(([id, calls]) => got.get(id)?.calls === calls && got.get(id)?.errors === 0)) {
      return want;
    }
    if (Date.now() >= deadline) {
      assert.equal(problem, undefined, `reported: after ${REPORTED_WITHIN_MS} ms`);
      const lines = Object.entries(want).map(([id, calls]) => {
        const inst = got.get(id);
        return inst !== undefined
          ? `${id}: rota counts ${inst.calls} calls and ${inst.errors} errors, its echo server answered ${calls} calls (errors want 0)`
          : `${id}: not in rota's view, its echo server answered ${calls} calls`;
      });
      assert.fail(`reported: rota's admin API did not match within ${REPORTED_WITHIN_MS} ms: ${lines.join('; ')}`);
    }
    // The next poll 75 ms after this one started, within the deadline above.
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, polled + REPORTED_EVERY_MS - Date.now())));
  }
}

/** A loopback port nothing listens on (bound, noted and closed): connections to it are refused. */
export async function closedPort(): Promise<number> {
  const listener = createServer();
  await new Promise<void>((resolve, reject) => {
    listener.once('error', reject);
    listener.listen(0, '127.0.0.1', resolve);
  });
  const address = listener.address();
  await new Promise<void>((resolve) => listener.close(() => resolve()));
  assert.ok(address !== null && typeof address === 'object');
  return address.port;
}

/** An entry of a scenario's `instances`. */
export interface ScenarioInstance {
  id: string;
  version?: string;
  weight?: number;
  unreachable?: boolean;
}

/**
 * What a scenario runs against: a `rota serve` on a free loopback port (its admin listener on
 * another, for {@link checkReported}), one echo server per
 * reachable instance and one registration per instance under `echo` (so that one can be
 * withdrawn), made by one provider client that reconnects quickly after a restart of rota.
 */
export class Fleet {
  /** Every call the echo servers answered, in order. */
  readonly log: EchoCall[] = [];
  readonly echoes = new Map<string, EchoServer>();
  /** The open registration of each instance still registered. */
  readonly registrations = new Map<string, Registration>();
  readonly provider: RotaClient;
  #server: RotaServer;

  private constructor(server: RotaServer) {
    this.#server = server;
    this.provider = new RotaClient(server.target, { logger: silentLogger, backoff: { initialMs: 20, maxMs: 300 } });
  }

  /** The rota server of the scenario (a new process after {@link restartRota}). */
  get server(): RotaServer {
    return this.#server;
  }

  /**
   * Starts rota and the instances and registers each; then sets `policy` (proto JSON, without
   * `service`) for `service`, when given.
   */
  static async start(instances: readonly ScenarioInstance[], options: { service?: string; policy?: Record<string, unknown> } = {}): Promise<Fleet> {
    const fleet = new Fleet(await RotaServer.start({ admin: true }));
    try {
      for (const inst of instances) {
        let port: number;
        if (inst.unreachable === true) {
          port = await closedPort();
        } else {
          const echo = await EchoServer.start(inst.id, fleet.log);
          fleet.echoes.set(inst.id, echo);
          port = echo.port;
        }
        fleet.registrations.set(
          inst.id,
          await fleet.provider.register({ id: inst.id, service: 'echo', host: '127.0.0.1', port, ...(inst.version !== undefined ? { version: inst.version } : {}), ...(inst.weight !== undefined ? { weight: inst.weight } : {}) }),
        );
      }
      if (options.policy !== undefined) {
        await setPolicy(fleet.server.target, options.service ?? 'echo', options.policy);
      }
      return fleet;
    } catch (error) {
      await fleet.close();
      throw error;
    }
  }

  /** The open registration of instance `id`. */
  registration(id: string): Registration {
    const registration = this.registrations.get(id);
    assert.ok(registration !== undefined, `${id} has no open registration`);
    return registration;
  }

  /** Withdraws instance `id` (closes its registration, which waits for rota's acknowledgement). */
  async withdraw(id: string): Promise<void> {
    await this.registration(id).close();
    this.registrations.delete(id);
  }

  /** Kills the rota server. */
  async stopRota(): Promise<void> {
    await this.#server.kill();
  }

  /**
   * Starts rota again on the same address (with `args` after `serve --listen ADDRESS`); resolves
   * when it lists every instance whose registration is open (the registrations reconnect by
   * themselves), bounded by 20 s.
   */
  async restartRota(args: readonly string[] = []): Promise<void> {
    const restarted = await RotaServer.start({ listen: this.#server.target, args, admin: true });
    this.#server = restarted;
    await waitFor(
      async () => (await this.provider.listInstances('echo').catch(() => ({ instances: [] }))).instances.length === this.registrations.size,
      { timeoutMs: 20_000, what: `every registration back in the restarted rota (${restarted.target})` },
    );
  }

  /** Closes the registrations and the provider, kills the echo servers and rota. */
  async close(): Promise<void> {
    for (const r of this.registrations.values()) {
      await r.close().catch(() => {});
    }
    await this.provider.close();
    for (const e of this.echoes.values()) {
      e.kill();
    }
    await this.#server.kill();
  }
}
