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
        const ack = await registration.withdraw();
        assert.ok(ack.seq >= 1n, 'withdraw acknowledged');
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

  for (const file of scenarioFiles) {
    const scenario = JSON.parse(readFileSync(join(scenariosDir, file), 'utf8')) as Scenario;
    it(`${file}: ${scenario.name}`, { timeout: 60_000 }, async () => {
      assert.ok(server !== undefined, 'the server is running');
      const run = new ScenarioRun(server.target, scenario.connections ?? 1);
      try {
        await run.run(scenario.steps);
      } finally {
        await run.close();
      }
    });
  }
});
