// Runs every shared conformance scenario (clients/conformance/scenarios/*.json) against one
// live rota server, following the step semantics of clients/conformance/README.md.

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { RotaClient, RotaError, codeName, type Ack, type InstanceSpec, type Registration } from '../src/index.js';
import { instanceId } from '../src/types.js';
import { RotaServer, repoRoot, silentLogger } from './harness.js';

interface PickRequestJson {
  service?: string;
  rule?: string;
  version?: string;
  key?: string;
  zone?: string;
  exclude?: string[];
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
  | {
      op: 'pick';
      connection?: number;
      request: PickRequestJson;
      expect: { id?: string; fallback?: boolean; ticket?: number; error?: string; message_contains?: string };
    }
  | {
      op: 'pick_sequence';
      connections: number[];
      request: PickRequestJson;
      count: number;
      expect_ids: string[];
      expect_fallback?: boolean;
    }
  | { op: 'list'; service: string; expect_ids: string[] };

interface Scenario {
  name: string;
  connections?: number;
  steps: Step[];
}

const SCENARIO_KEYS = new Set(['name', 'connections', 'steps']);
const STEP_KEYS: Record<string, ReadonlySet<string>> = {
  register: new Set(['op', 'stream', 'instances', 'expect_accepted', 'expect_refused']),
  withdraw: new Set(['op', 'stream']),
  pick: new Set(['op', 'connection', 'request', 'expect']),
  pick_sequence: new Set(['op', 'connections', 'request', 'count', 'expect_ids', 'expect_fallback']),
  list: new Set(['op', 'service', 'expect_ids']),
};
const REQUEST_KEYS = new Set(['service', 'rule', 'version', 'key', 'zone', 'exclude']);
const INSTANCE_KEYS = new Set(['service', 'id', 'host', 'port', 'version', 'zone', 'weight', 'metadata', 'status']);
const EXPECT_KEYS = new Set(['id', 'fallback', 'ticket', 'error', 'message_contains']);
const REFUSAL_KEYS = new Set(['id', 'code']);

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
  const keys = STEP_KEYS[String(raw['op'])];
  assert.ok(keys !== undefined, `unknown op ${JSON.stringify(raw['op'])}`);
  checkKeys('step', raw, keys);
  checkKeys('request', raw['request'], REQUEST_KEYS);
  checkKeys('expect', raw['expect'], EXPECT_KEYS);
  for (const instance of (raw['instances'] as unknown[] | undefined) ?? []) {
    checkKeys('instance', instance, INSTANCE_KEYS);
  }
  for (const refusal of (raw['expect_refused'] as unknown[] | undefined) ?? []) {
    checkKeys('expect_refused entry', refusal, REFUSAL_KEYS);
  }
}

/** Runs one scenario against the server at `target`; rejects at the first step that fails. */
async function runScenario(target: string, scenario: Scenario): Promise<void> {
  checkKeys('scenario', scenario, SCENARIO_KEYS);
  const run = new ScenarioRun(target, scenario.connections ?? 1);
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

class ScenarioRun {
  readonly #target: string;
  readonly #connections: RotaClient[];
  readonly #provider: RotaClient;
  readonly #streams = new Map<string, Registration>();

  constructor(target: string, connections: number) {
    this.#target = target;
    const open = () => new RotaClient(this.#target, { channelOptions: OWN_CONNECTION, logger: silentLogger });
    this.#connections = Array.from({ length: connections }, open);
    this.#provider = open();
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
    await Promise.allSettled([...this.#streams.values()].map((registration) => registration.close()));
    await Promise.allSettled([...this.#connections, this.#provider].map((client) => client.close()));
  }

  #connection(index: number): RotaClient {
    const client = this.#connections[index];
    assert.ok(client !== undefined, `the scenario has no connection ${index}`);
    return client;
  }

  async #step(step: Step): Promise<void> {
    switch (step.op) {
      case 'register': {
        let ack: Ack;
        const open = this.#streams.get(step.stream);
        if (open !== undefined) {
          ack = await open.announce(step.instances);
        } else {
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
        const registration = this.#streams.get(step.stream);
        assert.ok(registration !== undefined, `no open stream named ${step.stream}`);
        const byServiceThenId = (a: { service: string; id: string }, b: { service: string; id: string }) =>
          a.service < b.service ? -1 : a.service > b.service ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
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
      case 'pick': {
        const client = this.#connection(step.connection ?? 0);
        const expect = step.expect;
        if (expect.error !== undefined) {
          await assert.rejects(pick(client, step.request), (error: unknown) => {
            assert.ok(error instanceof RotaError, `expected a RotaError, got ${String(error)}`);
            assert.equal(error.codeName, expect.error, `status code (${error.details})`);
            assert.equal(error.unreachable, false, 'an answer of the server');
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
        const result = await pick(client, step.request);
        assert.equal(result.instance.id, expect.id, 'picked id');
        assert.equal(result.localFallback, false, 'answered by rota');
        if (expect.fallback !== undefined) {
          assert.equal(result.fallback !== '', expect.fallback, `fallback ${JSON.stringify(result.fallback)}`);
        }
        if (expect.ticket !== undefined) {
          assert.equal(result.ticket, BigInt(expect.ticket), 'ticket');
        }
        return;
      }
      case 'pick_sequence': {
        assert.ok(step.connections.length > 0, 'pick_sequence names at least one connection');
        const ids: string[] = [];
        const fallbacks: string[] = [];
        for (let i = 0; i < step.count; i += 1) {
          const client = this.#connection(step.connections[i % step.connections.length] as number);
          const result = await pick(client, step.request);
          assert.equal(result.localFallback, false, `pick ${i} answered by rota`);
          ids.push(result.instance.id);
          fallbacks.push(result.fallback);
        }
        assert.deepEqual(ids, step.expect_ids, 'picked ids');
        if (step.expect_fallback !== undefined) {
          assert.deepEqual(
            fallbacks.map((fallback) => fallback !== ''),
            fallbacks.map(() => step.expect_fallback),
            `fallbacks ${JSON.stringify(fallbacks)}`,
          );
        }
        return;
      }
      case 'list': {
        const list = await this.#provider.listInstances(step.service);
        assert.deepEqual(
          list.instances.map((instance) => instance.id),
          step.expect_ids,
          'listed ids',
        );
        return;
      }
      default:
        throw new Error(`unknown op ${JSON.stringify((step as { op: unknown }).op)}`);
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
    await assert.rejects(runScenario(server.target, wrong), /step 1 \(pick\) failed: picked id/);
  });

  it('fails a scenario with a key it does not know', async () => {
    assert.ok(server !== undefined, 'the server is running');
    const misspelt = JSON.parse(
      '{ "name": "runner self-check", "steps": [ { "op": "pick", "request": { "service": "conf-selfcheck-2" }, "expect": { "eror": "NOT_FOUND" } } ] }',
    ) as Scenario;
    await assert.rejects(runScenario(server.target, misspelt), /unknown key "eror" in expect/);
    const topLevel = JSON.parse('{ "name": "x", "conections": 2, "steps": [] }') as Scenario;
    await assert.rejects(runScenario(server.target, topLevel), /unknown key "conections" in scenario/);
  });

  for (const file of scenarioFiles) {
    const scenario = JSON.parse(readFileSync(join(scenariosDir, file), 'utf8')) as Scenario;
    it(`${file}: ${scenario.name}`, { timeout: 60_000 }, async () => {
      assert.ok(server !== undefined, 'the server is running');
      await runScenario(server.target, scenario);
    });
  }
});
