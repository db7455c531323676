// Runs every shared conformance scenario (clients/conformance/scenarios/*.json) against one
// live rota server, following the step semantics of clients/conformance/README.md.

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { credentials } from '@grpc/grpc-js';

import {
  RotaError,
  RotaClient,
  codeName,
  type Ack,
  type CallResult,
  type InstanceSpec,
  type InstanceStatus,
  type Registration,
  type WatchEvent,
} from '../src/index.js';
import type { BalancerClient } from '../src/generated/rota/v1/Balancer.js';
import type { LeaseResponse__Output } from '../src/generated/rota/v1/LeaseResponse.js';
import { rotaV1 } from '../src/proto.js';
import { instanceId } from '../src/types.js';
import { RotaServer, repoRoot, silentLogger, waitFor } from './harness.js';

interface PickRequestJson {
  service?: string;
  rule?: string;
  version?: string;
  key?: string;
  zone?: string;
  exclude?: string[];
}

interface PickExpect {
  id?: string;
  fallback?: boolean;
  ticket?: number;
  rule?: string;
  local?: boolean;
  error?: string;
  message_contains?: string;
  unreachable?: boolean;
}

interface EventJson {
  snapshot?: string[];
  added?: string;
  updated?: string;
  removed?: string;
  status?: string;
}

type Step =
  | {
      op: 'register';
      stream: string;
      instances: InstanceSpec[];
      expect_accepted?: string[];
      expect_refused?: { id: string; code: string | number }[];
    }
  | { op: 'withdraw'; stream: string }
  | { op: 'pick'; connection?: number; request: PickRequestJson; expect: PickExpect }
  | {
      op: 'pick_sequence';
      connections: number[];
      request: PickRequestJson;
      count: number;
      expect_ids: string[];
      expect_fallback?: boolean;
      expect_tickets?: number[];
      expect_rule?: string;
      expect_local?: boolean;
    }
  | { op: 'list'; service: string; expect_ids: string[] }
  | { op: 'update'; stream: string; service: string; id: string; status?: InstanceStatus; weight?: number }
  | {
      op: 'report';
      connection?: number;
      outcomes: { service: string; instance_id: string; ticket?: number; rule?: string; latency_us?: number; result: CallResult }[];
      expect_accepted?: number;
      expect_ignored?: number;
    }
  | {
      op: 'lease';
      connection?: number;
      request: { service: string; rule?: string; version?: string; count: number; exclude?: string[] };
      expect: { first_ticket: number; count: number; ids: string[]; positions?: number[]; rule?: string; fallback?: boolean };
    }
  | { op: 'watch'; watch: string; connection?: number; service: string }
  | { op: 'watch_expect'; watch: string; events: EventJson[] }
  | { op: 'follow'; connection?: number; service: string; expect_ids: string[] }
  | { op: 'stop_server' }
  | { op: 'start_server'; warmup: string };

interface Scenario {
  name: string;
  connections?: number;
  steps: Step[];
}

/** How long a step may wait for something to arrive (a watch event, a followed list). */
const PATIENCE_MS = 20_000;

const SCENARIO_KEYS = new Set(['name', 'connections', 'steps']);
const STEP_KEYS: Record<string, ReadonlySet<string>> = {
  register: new Set(['op', 'stream', 'instances', 'expect_accepted', 'expect_refused']),
  withdraw: new Set(['op', 'stream']),
  pick: new Set(['op', 'connection', 'request', 'expect']),
  pick_sequence: new Set([
    'op',
    'connections',
    'request',
    'count',
    'expect_ids',
    'expect_fallback',
    'expect_tickets',
    'expect_rule',
    'expect_local',
  ]),
  list: new Set(['op', 'service', 'expect_ids']),
  update: new Set(['op', 'stream', 'service', 'id', 'status', 'weight']),
  report: new Set(['op', 'connection', 'outcomes', 'expect_accepted', 'expect_ignored']),
  lease: new Set(['op', 'connection', 'request', 'expect']),
  watch: new Set(['op', 'watch', 'connection', 'service']),
  watch_expect: new Set(['op', 'watch', 'events']),
  follow: new Set(['op', 'connection', 'service', 'expect_ids']),
  stop_server: new Set(['op']),
  start_server: new Set(['op', 'warmup']),
};
const REQUEST_KEYS = new Set(['service', 'rule', 'version', 'key', 'zone', 'exclude']);
const LEASE_REQUEST_KEYS = new Set(['service', 'rule', 'version', 'count', 'exclude']);
const INSTANCE_KEYS = new Set(['service', 'id', 'host', 'port', 'version', 'zone', 'weight', 'metadata', 'status']);
const EXPECT_KEYS = new Set(['id', 'fallback', 'ticket', 'rule', 'local', 'error', 'message_contains', 'unreachable']);
const LEASE_EXPECT_KEYS = new Set(['first_ticket', 'count', 'ids', 'positions', 'rule', 'fallback']);
const REFUSAL_KEYS = new Set(['id', 'code']);
const OUTCOME_KEYS = new Set(['service', 'instance_id', 'ticket', 'rule', 'latency_us', 'result']);
const EVENT_KEYS = new Set(['snapshot', 'added', 'updated', 'removed', 'status']);

/** Fails on a key the conformance README does not define: a misspelt expectation is not skipped. */
function checkKeys(what: string, value: unknown, allowed: ReadonlySet<string>): void {
  if (value === undefined) {
    return;
  }
  assert.ok(value !== null && typeof value === 'object' && !Array.isArray(value), `${what} is not an object`);
  for (const key of Object.keys(value)) {
    assert.ok(allowed.has(key), `unknown key ${JSON.stringify(key)} in ${what} (known: ${[...allowed].sort().join(', ')})`);
  }
}

function checkStep(step: Step): void {
  const raw = step as unknown as Record<string, unknown>;
  const op = String(raw['op']);
  const keys = STEP_KEYS[op];
  assert.ok(keys !== undefined, `unknown op ${JSON.stringify(raw['op'])}`);
  checkKeys('step', raw, keys);
  checkKeys('request', raw['request'], op === 'lease' ? LEASE_REQUEST_KEYS : REQUEST_KEYS);
  checkKeys('expect', raw['expect'], op === 'lease' ? LEASE_EXPECT_KEYS : EXPECT_KEYS);
  const each = (field: string, what: string, allowed: ReadonlySet<string>) => {
    for (const entry of (raw[field] as unknown[] | undefined) ?? []) {
      checkKeys(what, entry, allowed);
    }
  };
  each('instances', 'instance', INSTANCE_KEYS);
  each('expect_refused', 'expect_refused entry', REFUSAL_KEYS);
  each('outcomes', 'outcome', OUTCOME_KEYS);
  each('events', 'event', EVENT_KEYS);
}

/** Whether a scenario stops (and starts) its server, so that it needs a server of its own. */
function stopsTheServer(scenario: Scenario): boolean {
  return scenario.steps.some((step) => step.op === 'stop_server');
}

/** Runs one scenario against `server`; rejects at the first step that fails. */
async function runScenario(server: RotaServer, scenario: Scenario): Promise<void> {
  checkKeys('scenario', scenario, SCENARIO_KEYS);
  const run = new ScenarioRun(server, scenario.connections ?? 1);
  try {
    await run.run(scenario.steps);
  } finally {
    await run.close();
  }
}

const scenariosDir = join(repoRoot, 'clients', 'conformance', 'scenarios');
const scenarioFiles = readdirSync(scenariosDir)
  .filter((name) => name.endsWith('.json'))
  .sort();

/** A connection of its own: grpc-js would otherwise share one TCP connection per target. */
const OWN_CONNECTION = { 'grpc.use_local_subchannel_pool': 1 };

function pick(client: RotaClient, request: PickRequestJson) {
  return client.pick(request.service ?? '', {
    rule: request.rule ?? '',
    // Missing fields take their proto defaults: no version, not the context's.
    version: request.version ?? '',
    key: request.key ?? '',
    zone: request.zone ?? '',
    exclude: request.exclude ?? [],
  });
}

/** An open raw watch whose events wait in a queue until a step reads them. */
class WatchQueue {
  readonly #iterator: AsyncGenerator<WatchEvent, void, undefined>;

  constructor(client: RotaClient, service: string) {
    this.#iterator = client.watch(service);
  }

  async next(): Promise<string> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => reject(new Error(`no event within ${PATIENCE_MS} ms`)), PATIENCE_MS);
    });
    try {
      const result = await Promise.race([this.#iterator.next(), timeout]);
      assert.ok(result.done !== true, 'the watch ended');
      return describeEvent(result.value);
    } finally {
      clearTimeout(timer);
    }
  }

  async close(): Promise<void> {
    // Ends the generator, which cancels the call.
    await this.#iterator.return(undefined);
  }
}

function describeEvent(event: WatchEvent): string {
  switch (event.type) {
    case 'snapshot':
      return `snapshot ${JSON.stringify(event.instances.map((i) => i.id))}`;
    case 'added':
      return `added ${event.instance.id}`;
    case 'updated':
      return `updated ${event.instance.id} ${event.instance.status}`;
    case 'removed':
      return `removed ${event.instance.id}`;
  }
}

function describeExpected(event: EventJson): string {
  const kinds = (['snapshot', 'added', 'updated', 'removed'] as const).filter((kind) => event[kind] !== undefined);
  assert.equal(kinds.length, 1, `an event names exactly one of snapshot, added, updated, removed: ${JSON.stringify(event)}`);
  switch (kinds[0]) {
    case 'snapshot':
      return `snapshot ${JSON.stringify(event.snapshot)}`;
    case 'updated':
      return `updated ${event.updated} ${event.status ?? 'UP'}`;
    default:
      return `${kinds[0]} ${event[kinds[0] as 'added' | 'removed']}`;
  }
}

function byServiceThenId(a: { service: string; id: string }, b: { service: string; id: string }): number {
  return a.service < b.service ? -1 : a.service > b.service ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

class ScenarioRun {
  #server: RotaServer;
  /** The servers this run started (start_server), stopped with it. */
  readonly #started: RotaServer[] = [];
  readonly #connections: RotaClient[];
  /** Registers for the register steps; undefined after stop_server until the next one needs it. */
  #provider: RotaClient | undefined;
  readonly #streams = new Map<string, Registration>();
  readonly #watches = new Map<string, WatchQueue>();
  readonly #leases: BalancerClient[] = [];

  constructor(server: RotaServer, connections: number) {
    this.#server = server;
    this.#connections = Array.from({ length: connections }, () => this.#open());
    this.#provider = this.#open();
  }

  #open(): RotaClient {
    return new RotaClient(this.#server.target, { channelOptions: OWN_CONNECTION, logger: silentLogger, pickTimeoutMs: 10_000 });
  }

  async run(steps: readonly Step[]): Promise<void> {
    for (const [index, step] of steps.entries()) {
      try {
        checkStep(step);
        await this.#step(step);
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        throw new Error(`step ${index} (${step.op}) failed: ${message}`, { cause: error });
      }
    }
  }

  async close(): Promise<void> {
    await Promise.allSettled([...this.#watches.values()].map((watch) => watch.close()));
    for (const lease of this.#leases) {
      lease.close();
    }
    await Promise.allSettled([...this.#streams.values()].map((registration) => registration.close()));
    const clients = this.#provider === undefined ? this.#connections : [...this.#connections, this.#provider];
    await Promise.allSettled(clients.map((client) => client.close()));
    await Promise.allSettled(this.#started.map((server) => server.kill()));
  }

  #connection(index: number | undefined): RotaClient {
    const client = this.#connections[index ?? 0];
    assert.ok(client !== undefined, `the scenario has no connection ${index}`);
    return client;
  }

  #stream(name: string): Registration {
    const registration = this.#streams.get(name);
    assert.ok(registration !== undefined, `no open stream named ${name}`);
    return registration;
  }

  async #step(step: Step): Promise<void> {
    switch (step.op) {
      case 'register': {
        let ack: Ack;
        const open = this.#streams.get(step.stream);
        if (open !== undefined) {
          ack = await open.announce(step.instances);
        } else {
          // Refusals are part of what a step checks, so they must not reject here.
          this.#provider ??= this.#open();
          const registration = await this.#provider.register(step.instances, { allowPartial: true });
          this.#streams.set(step.stream, registration);
          ack = registration.ack;
        }
        const expectedAccepted = step.expect_accepted ?? step.instances.map(instanceId);
        const expectedRefused = (step.expect_refused ?? []).map(
          (refusal) => `${refusal.id} ${typeof refusal.code === 'number' ? codeName(refusal.code) : refusal.code}`,
        );
        assert.deepEqual(
          ack.accepted.map((ref) => ref.id),
          expectedAccepted,
          'accepted ids',
        );
        assert.deepEqual(
          ack.refused.map((refusal) => `${refusal.instance.id} ${codeName(refusal.code)}`).sort(),
          expectedRefused.sort(),
          'refused instances',
        );
        return;
      }
      case 'withdraw': {
        const registration = this.#stream(step.stream);
        const held = [...registration.instances].sort(byServiceThenId).map((ref) => `${ref.service}/${ref.id}`);
        const ack = await registration.withdraw();
        // The ack lists what was withdrawn, ordered by (service, id): everything the stream held.
        assert.deepEqual(
          ack.accepted.map((ref) => `${ref.service}/${ref.id}`),
          held,
          'withdrawn instances',
        );
        assert.deepEqual(ack.refused, [], 'nothing refused');
        await registration.close();
        this.#streams.delete(step.stream);
        return;
      }
      case 'pick':
        return this.#pick(this.#connection(step.connection), step.request, step.expect);
      case 'pick_sequence': {
        assert.ok(step.connections.length > 0, 'pick_sequence names at least one connection');
        const ids: string[] = [];
        const tickets: bigint[] = [];
        for (let i = 0; i < step.count; i += 1) {
          const result = await pick(this.#connection(step.connections[i % step.connections.length]), step.request);
          assert.equal(result.localFallback, step.expect_local ?? false, `pick ${i} made locally`);
          if (step.expect_fallback !== undefined) {
            assert.equal(result.fallback !== '', step.expect_fallback, `fallback of pick ${i}: ${JSON.stringify(result.fallback)}`);
          }
          if (step.expect_rule !== undefined) {
            assert.equal(result.rule, step.expect_rule, `rule of pick ${i}`);
          }
          ids.push(result.instance.id);
          tickets.push(result.ticket);
        }
        assert.deepEqual(ids, step.expect_ids, 'picked ids');
        if (step.expect_tickets !== undefined) {
          assert.deepEqual(tickets, step.expect_tickets.map(BigInt), 'tickets');
        }
        return;
      }
      case 'list': {
        const list = await this.#connection(0).listInstances(step.service);
        assert.deepEqual(
          list.instances.map((instance) => instance.id),
          step.expect_ids,
          'listed ids',
        );
        return;
      }
      case 'update': {
        const ref = { service: step.service, id: step.id };
        const ack = await this.#stream(step.stream).update(ref, {
          ...(step.status !== undefined ? { status: step.status } : {}),
          ...(step.weight !== undefined ? { weight: step.weight } : {}),
        });
        assert.deepEqual(ack.accepted, [ref], 'updated');
        assert.deepEqual(ack.refused, [], 'refused');
        return;
      }
      case 'report': {
        const result = await this.#connection(step.connection).report(
          step.outcomes.map((o) => ({
            service: o.service,
            instanceId: o.instance_id,
            ticket: BigInt(o.ticket ?? 0),
            rule: o.rule ?? '',
            latencyUs: o.latency_us ?? 0,
            result: o.result,
          })),
        );
        assert.deepEqual(
          result,
          { accepted: step.expect_accepted ?? step.outcomes.length, ignored: step.expect_ignored ?? 0 },
          'report (accepted, ignored)',
        );
        return;
      }
      case 'lease': {
        // The client does not wrap Lease: the generated client, on a connection of its own.
        const balancer = new (rotaV1().Balancer)(this.#server.target, credentials.createInsecure(), OWN_CONNECTION);
        this.#leases.push(balancer);
        const request = {
          service: step.request.service,
          rule: step.request.rule ?? '',
          version: step.request.version ?? '',
          count: step.request.count,
          exclude: step.request.exclude ?? [],
        };
        const leased = await new Promise<LeaseResponse__Output>((resolve, reject) => {
          balancer.Lease(request, { deadline: Date.now() + PATIENCE_MS }, (error, value) =>
            error !== null && error !== undefined ? reject(RotaError.fromServiceError(error)) : resolve(value as LeaseResponse__Output),
          );
        });
        assert.deepEqual(
          [leased.firstTicket, leased.count, leased.instances.map((i) => i.id)],
          [String(step.expect.first_ticket), step.expect.count, step.expect.ids],
          'leased (first ticket, count, instances)',
        );
        if (step.expect.positions !== undefined) {
          assert.deepEqual(leased.positions, step.expect.positions, 'positions');
        }
        if (step.expect.rule !== undefined) {
          assert.equal(leased.rule, step.expect.rule, 'rule');
        }
        if (step.expect.fallback !== undefined) {
          assert.equal(leased.fallback !== '', step.expect.fallback, `fallback ${JSON.stringify(leased.fallback)}`);
        }
        return;
      }
      case 'watch':
        this.#watches.set(step.watch, new WatchQueue(this.#connection(step.connection), step.service));
        return;
      case 'watch_expect': {
        const watch = this.#watches.get(step.watch);
        assert.ok(watch !== undefined, `no watch named ${step.watch}`);
        for (const [n, expected] of step.events.entries()) {
          assert.equal(await watch.next(), describeExpected(expected), `event ${n}`);
        }
        return;
      }
      case 'follow': {
        const client = this.#connection(step.connection);
        await client.follow(step.service, { timeoutMs: PATIENCE_MS });
        await waitFor(() => client.cachedInstances(step.service).map((i) => i.id).join('\n') === step.expect_ids.join('\n'), {
          what: `the followed list ${JSON.stringify(step.expect_ids)}`,
          timeoutMs: PATIENCE_MS,
        });
        return;
      }
      case 'stop_server': {
        await this.#server.kill('SIGKILL');
        // The providers are gone with it: nothing re-announces to a later server.
        await Promise.allSettled([...this.#streams.values()].map((registration) => registration.close()));
        this.#streams.clear();
        await this.#provider?.close();
        this.#provider = undefined;
        return;
      }
      case 'start_server':
        this.#server = await RotaServer.start({ listen: this.#server.target, args: ['--warmup', step.warmup] });
        this.#started.push(this.#server);
        return;
      default:
        throw new Error(`unknown op ${JSON.stringify((step as { op: unknown }).op)}`);
    }
  }

  async #pick(client: RotaClient, request: PickRequestJson, expect: PickExpect): Promise<void> {
    if (expect.error !== undefined) {
      await assert.rejects(pick(client, request), (error: unknown) => {
        assert.ok(error instanceof RotaError, `expected a RotaError, got ${String(error)}`);
        assert.equal(error.codeName, expect.error, `status code (${error.details})`);
        if (expect.unreachable !== undefined) {
          assert.equal(error.unreachable, expect.unreachable, `unreachable (reason ${JSON.stringify(error.reason)})`);
        }
        if (expect.message_contains !== undefined) {
          assert.ok(
            error.details.includes(expect.message_contains),
            `message ${JSON.stringify(error.details)} should contain ${JSON.stringify(expect.message_contains)}`,
          );
        }
        return true;
      });
      return;
    }
    const result = await pick(client, request);
    assert.equal(result.localFallback, expect.local ?? false, 'made locally');
    assert.equal(result.instance.id, expect.id, 'picked id');
    if (expect.fallback !== undefined) {
      assert.equal(result.fallback !== '', expect.fallback, `fallback ${JSON.stringify(result.fallback)}`);
    }
    if (expect.ticket !== undefined) {
      assert.equal(result.ticket, BigInt(expect.ticket), 'ticket');
    }
    if (expect.rule !== undefined) {
      assert.equal(result.rule, expect.rule, 'rule');
    }
  }
}

describe('conformance scenarios', () => {
  let server: RotaServer | undefined;

  before(async () => {
    server = await RotaServer.start();
  });

  after(async () => {
    await server?.stop();
  });

  it('finds the scenario files', () => {
    assert.ok(scenarioFiles.length > 0, `no scenarios in ${scenariosDir}`);
  });

  it('fails a scenario whose expectation is wrong', async () => {
    assert.ok(server !== undefined, 'the server is running');
    const wrong: Scenario = {
      name: 'runner self-check',
      steps: [
        { op: 'register', stream: 'p', instances: [{ service: 'conf-selfcheck', id: 'a', host: '127.0.0.1', port: 7001 }] },
        { op: 'pick', request: { service: 'conf-selfcheck', rule: 'round_robin' }, expect: { id: 'b' } },
      ],
    };
    await assert.rejects(runScenario(server, wrong), /step 1 \(pick\) failed: picked id/);
    const local: Scenario = {
      name: 'runner self-check 2',
      steps: [
        { op: 'register', stream: 'p', instances: [{ service: 'conf-selfcheck-local', id: 'a', host: '127.0.0.1', port: 7001 }] },
        { op: 'pick_sequence', connections: [0], count: 1, request: { service: 'conf-selfcheck-local' }, expect_ids: ['a'], expect_local: true },
      ],
    };
    await assert.rejects(runScenario(server, local), /step 1 \(pick_sequence\) failed: pick 0 made locally/);
  });

  it('fails a scenario with a key it does not know', async () => {
    assert.ok(server !== undefined, 'the server is running');
    const misspelt = JSON.parse(
      '{ "name": "runner self-check", "steps": [ { "op": "pick", "request": { "service": "conf-selfcheck-2" }, "expect": { "eror": "NOT_FOUND" } } ] }',
    ) as Scenario;
    await assert.rejects(runScenario(server, misspelt), /unknown key "eror" in expect/);
    const topLevel = JSON.parse('{ "name": "x", "conections": 2, "steps": [] }') as Scenario;
    await assert.rejects(runScenario(server, topLevel), /unknown key "conections" in scenario/);
    const outcome = JSON.parse(
      '{ "name": "x", "steps": [ { "op": "report", "outcomes": [ { "service": "s", "instance": "a", "result": "OK" } ] } ] }',
    ) as Scenario;
    await assert.rejects(runScenario(server, outcome), /unknown key "instance" in outcome/);
  });

  for (const file of scenarioFiles) {
    const scenario = JSON.parse(readFileSync(join(scenariosDir, file), 'utf8')) as Scenario;
    it(`${file}: ${scenario.name}`, { timeout: 90_000 }, async () => {
      assert.ok(server !== undefined, 'the server is running');
      if (stopsTheServer(scenario)) {
        const own = await RotaServer.start();
        try {
          await runScenario(own, scenario);
        } finally {
          await own.kill();
        }
      } else {
        await runScenario(server, scenario);
      }
    });
  }
});
