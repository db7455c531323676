// The rota channel for grpc-js: the runner's oracle of rota's rules against rota's lease
// positions, the hold-out of an instance whose calls time out, and the shared channel scenarios
// (clients/conformance/channel) against a live rota and echo servers, with a second consumer
// process in Go when the go command is at hand.

import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import { RotaClient, type Registration } from '../src/index.js';
import { OPTION_BACKOFF, OPTION_LOGGER, OPTION_RULE, OPTION_SERVER, OPTION_TICKET_HEADER } from '../src/channel/index.js';
import { HOLD_AFTER_TIMEOUTS, HOLD_MS, HoldOut, MAX_HOLD_MS } from '../src/channel/holdout.js';
import { positionsOf } from '../src/channel/lease.js';
import type { LeaseResponse__Output } from '../src/generated/rota/v1/LeaseResponse.js';
import { rotaV1 } from '../src/proto.js';
import { echoCalls, echoPackage, type EchoResult } from './echo.js';
import { RotaServer, packageDir, repoRoot, silentLogger, waitFor } from './harness.js';
import { oraclePosition, oraclePositions, weightedCycle } from './oracle.js';
import { Fleet, checkExpect, checkKeys, checkReported, checkRotation, drawOutOfBand, policyMessage, type Expect, type ScenarioInstance } from './scenario.js';

function letters(rule: string, weights: number[], tickets: number): string {
  return oraclePositions(rule, weights, 0n, tickets)
    .map((p) => String.fromCharCode(65 + p))
    .join('');
}

describe("the runner's oracle of rota's rules (test/oracle.ts)", () => {
  it('follows the sequences rota pins for its rules', () => {
    assert.equal(letters('round_robin', [1, 1, 1], 7), 'ABCABCA');
    assert.equal(letters('repeat(n=3)', [1, 1, 1], 12), 'AAABBBCCCAAA');
    assert.equal(letters('repeat', [1, 1], 8), 'AAABBBAA');
    assert.equal(letters('repeat(n=5)', [1, 1], 12), 'AAAAABBBBBAA');
    assert.equal(letters('weighted', [5, 1, 1], 14), 'AAABCAAAAABCAA');
    assert.equal(letters('weighted', [2, 1], 3), 'ABA');
    assert.equal(letters('weighted', [100, 100, 100], 3), 'ABC');
    assert.equal(letters('weighted', [3, 0, 1], 4), 'AACA');
    assert.deepEqual([...weightedCycle([300, 100, 100])], [0, 0, 1, 2, 0]);
    assert.throws(() => oraclePosition('random', [1], 0n), /no mapping/);
  });
});

describe('holding out an instance whose calls time out', () => {
  const clock = (): { now: () => number; advance: (ms: number) => void } => {
    let t = 1_000;
    return { now: () => t, advance: (ms) => (t += ms) };
  };
  const timeout = (h: HoldOut): void => h.ended(h.generation, grpc.status.DEADLINE_EXCEEDED);

  it('holds out after 3 timeouts in a row for 10 s, doubling up to 60 s', () => {
    const c = clock();
    const h = new HoldOut(c.now);
    timeout(h);
    timeout(h);
    assert.ok(h.usable());
    timeout(h);
    assert.ok(!h.usable());
    assert.equal(h.holdMs, HOLD_MS);
    c.advance(HOLD_MS - 1);
    assert.ok(!h.usable());
    c.advance(1);
    assert.ok(h.usable());
    assert.equal(h.holdMs, 0);
    // Tried again and timing out: each further 3 in a row double the hold, at most 60 s.
    for (const want of [20_000, 40_000, MAX_HOLD_MS, MAX_HOLD_MS]) {
      timeout(h);
      timeout(h);
      assert.ok(h.usable());
      timeout(h);
      assert.ok(!h.usable());
      assert.equal(h.holdMs, want);
      c.advance(want - 1);
      assert.ok(!h.usable());
      c.advance(1);
      assert.ok(h.usable());
    }
    assert.equal(HOLD_AFTER_TIMEOUTS, 3);
  });

  it('counts only timeouts in a row: an answer resets the count and the doubling', () => {
    const c = clock();
    const h = new HoldOut(c.now);
    for (const answer of [grpc.status.OK, grpc.status.INTERNAL, grpc.status.NOT_FOUND, grpc.status.RESOURCE_EXHAUSTED]) {
      timeout(h);
      timeout(h);
      h.ended(h.generation, answer);
      timeout(h);
      timeout(h);
      assert.ok(h.usable(), `after an answer ${answer}`);
      h.ended(h.generation, grpc.status.OK);
    }
    for (let n = 0; n < 3; n++) {
      timeout(h);
    }
    c.advance(HOLD_MS);
    assert.ok(h.usable());
    h.ended(h.generation, grpc.status.OK);
    for (let n = 0; n < 3; n++) {
      timeout(h);
    }
    assert.equal(h.holdMs, HOLD_MS, 'an answer after a hold starts the doubling over');
  });

  it('neither counts nor resets a cancelled call or a connect failure', () => {
    for (const neutral of [grpc.status.CANCELLED, grpc.status.UNAVAILABLE]) {
      const h = new HoldOut(clock().now);
      timeout(h);
      h.ended(h.generation, neutral);
      timeout(h);
      h.ended(h.generation, neutral);
      h.ended(h.generation, neutral);
      h.ended(h.generation, neutral);
      assert.ok(h.usable(), `${neutral} counted as a timeout`);
      timeout(h);
      assert.ok(!h.usable(), `${neutral} reset the count`);
    }
  });

  it('does not count the timeouts of calls sent before the hold began', () => {
    const c = clock();
    const h = new HoldOut(c.now);
    const before = h.generation;
    for (let n = 0; n < 3; n++) {
      h.ended(before, grpc.status.DEADLINE_EXCEEDED);
    }
    assert.ok(!h.usable());
    // Six more calls sent before the hold end after it began: the hold stays 10 s.
    for (let n = 0; n < 6; n++) {
      h.ended(before, grpc.status.DEADLINE_EXCEEDED);
    }
    assert.equal(h.holdMs, HOLD_MS);
    c.advance(HOLD_MS);
    assert.ok(h.usable());
  });
});

describe("rota's lease positions against the runner's oracle", { timeout: 60_000 }, () => {
  let server: RotaServer;
  let rota: RotaClient;
  let registration: Registration;
  before(async () => {
    server = await RotaServer.start();
    rota = await RotaClient.connect(server.target, { logger: silentLogger });
    registration = await rota.register(
      [30, 10, 20, 0, 10].map((weight, i) => ({ id: `p-${i}`, service: 'parity', host: '127.0.0.1', port: 7000 + i, weight })),
    );
  });
  after(async () => {
    await registration.close();
    await rota.close();
    await server.stop();
  });

  it('positions every leased ticket as the oracle maps it, with and without exclude', async () => {
    const balancer = new (rotaV1().Balancer)(server.target, grpc.credentials.createInsecure());
    const lease = (request: { service: string; rule: string; count: number; exclude?: string[] }): Promise<LeaseResponse__Output> =>
      new Promise((resolve, reject) =>
        balancer.Lease(request, { deadline: Date.now() + 5_000 }, (error: grpc.ServiceError | null, r?: LeaseResponse__Output) => (error ? reject(error) : resolve(r!))),
      );
    try {
      for (const rule of ['round_robin', 'repeat(n=3)', 'weighted']) {
        for (const exclude of [[], ['p-2'], ['p-0', 'p-4']]) {
          const leased = await lease({ service: 'parity', rule, count: 40, exclude });
          const ids = leased.instances.map((i) => i.id);
          assert.deepEqual(ids, ['p-0', 'p-1', 'p-2', 'p-3', 'p-4'].filter((id) => !exclude.includes(id)), `${rule} exclude ${exclude.join(',')}`);
          const weights = leased.instances.map((i) => i.weight ?? 100);
          assert.deepEqual(leased.positions, oraclePositions(rule, weights, BigInt(leased.firstTicket), leased.count), `${rule} exclude ${exclude.join(',')}`);
          // What the channel accepts of it: one position per ticket, each in the list.
          assert.deepEqual(positionsOf(leased), leased.positions);
        }
      }
    } finally {
      balancer.close();
    }
  });
});

describe('a rule rota cannot lease', { timeout: 60_000 }, () => {
  it("is not refused by the channel: rota's refusal fails the calls with its message", async () => {
    const fleet = await Fleet.start([{ id: 'echo-a' }]);
    const client = new (echoPackage().Echo)('rota:///echo', grpc.credentials.createInsecure(), {
      [OPTION_SERVER]: fleet.server.target,
      [OPTION_RULE]: 'random',
      [OPTION_LOGGER]: silentLogger,
    });
    try {
      const results = await echoCalls(client, 2, '', 5_000);
      assert.deepEqual(
        results.map((r) => [r.error?.code, r.error?.details]),
        results.map(() => [grpc.status.UNAVAILABLE, 'rule is "random", which cannot be leased; leasable rules: round_robin, repeat, weighted']),
      );
      assert.equal(fleet.log.length, 0, 'no call went out on a local rotation');
    } finally {
      client.close();
      await fleet.close();
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

interface Step {
  calls?: number;
  consumers?: number;
  version?: string;
  deadline_ms?: number;
  expect?: Expect;
  withdraw?: string;
  within_ms?: number;
  kill?: string;
  hang?: string;
  stop_rota?: boolean;
  restart_rota?: boolean;
  await_leases?: boolean;
  draw?: number;
}

interface Scenario {
  name: string;
  rule: string;
  service?: string;
  instances: ScenarioInstance[];
  policy?: Record<string, unknown>;
  steps: Step[];
}

const scenarioDir = join(repoRoot, 'clients', 'conformance', 'channel');

// The keys clients/conformance/channel/README.md defines; any other key fails the scenario.
const SCENARIO_KEYS = new Set(['name', 'rule', 'service', 'instances', 'policy', 'steps']);
const INSTANCE_KEYS = new Set(['id', 'version', 'weight', 'unreachable']);
const EXPECT_KEYS = new Set(['failures', 'error_contains', 'leased', 'rotation', 'runs', 'only', 'never', 'spread', 'counts', 'balanced', 'reported']);
/** Each step's action key and the keys that may go with it. */
const STEP_KEYS: Record<string, ReadonlySet<string>> = {
  calls: new Set(['calls', 'consumers', 'version', 'deadline_ms', 'expect']),
  withdraw: new Set(['withdraw', 'within_ms']),
  kill: new Set(['kill']),
  hang: new Set(['hang']),
  stop_rota: new Set(['stop_rota']),
  restart_rota: new Set(['restart_rota']),
  await_leases: new Set(['await_leases', 'within_ms']),
  draw: new Set(['draw']),
};

/** Fails on a key the channel scenario format does not define, anywhere in the scenario. */
function checkScenario(sc: Scenario): void {
  checkKeys('scenario', sc, SCENARIO_KEYS);
  for (const inst of sc.instances) {
    checkKeys('instance', inst, INSTANCE_KEYS);
  }
  if (sc.policy !== undefined) {
    policyMessage(sc.policy);
  }
  for (const [i, step] of sc.steps.entries()) {
    const actions = Object.keys(step).filter((k) => k in STEP_KEYS);
    assert.equal(actions.length, 1, `step ${i} has ${actions.length} actions (${actions.join(', ')}), want one of ${Object.keys(STEP_KEYS).join(', ')}; its keys: ${Object.keys(step).map((k) => `"${k}"`).join(', ')}`);
    checkKeys(`step ${i}`, step, STEP_KEYS[actions[0]!]!);
    checkKeys(`step ${i} expect`, step.expect, EXPECT_KEYS);
  }
}

/** The second consumer: the Go client's echoconsumer when go is at hand, else a Node process. */
function secondConsumer(): { language: string; command: string; args: (target: string, rule: string, calls: number, version: string, deadlineMs: number) => string[] } {
  try {
    const dir = mkdtempSync(join(tmpdir(), 'rota-echoconsumer-'));
    process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
    const binary = join(dir, 'echoconsumer');
    execFileSync('go', ['build', '-o', binary, './cmd/echoconsumer'], { cwd: join(repoRoot, 'clients', 'go'), stdio: 'ignore', timeout: 300_000 });
    return {
      language: 'Go',
      command: binary,
      args: (target, rule, calls, version, deadlineMs) => ['-target', target, '-rule', rule, '-calls', String(calls), '-version', version, '-deadline', `${deadlineMs}ms`],
    };
  } catch {
    return {
      language: 'Node',
      command: process.execPath,
      args: (target, rule, calls, version, deadlineMs) => [join(packageDir, 'build', 'test', 'channel-consumer.js'), target, rule, String(calls), version, String(deadlineMs)],
    };
  }
}

function runProcess(command: string, args: string[]): Promise<EchoResult[]> {
  return new Promise((resolve, reject) => {
    execFile(command, args, { timeout: 120_000 }, (error, stdout, stderr) => {
      if (error !== null) {
        reject(new Error(`${command}: ${error.message}\n${stderr}`));
        return;
      }
      const results: EchoResult[] = [];
      for (const line of stdout.split('\n').filter((l) => l !== '')) {
        if (line.startsWith('ok ')) {
          results.push({ instance: line.slice(3) });
        } else if (line.startsWith('fail ')) {
          results.push({ error: Object.assign(new Error(line.slice(5)), { code: grpc.status.UNKNOWN, details: line.slice(5), metadata: new grpc.Metadata() }) });
        } else {
          reject(new Error(`consumer printed ${line}`));
          return;
        }
      }
      resolve(results);
    });
  });
}

const consumer = secondConsumer();

/** Runs one channel scenario against a rota of its own; rejects at the first unmet expectation. */
async function runScenario(sc: Scenario): Promise<void> {
  checkScenario(sc);
  const service = sc.service ?? 'echo';
  const fleet = await Fleet.start(sc.instances, { service, ...(sc.policy !== undefined ? { policy: sc.policy } : {}) });
  const log = fleet.log;
  let client: grpc.Client | undefined;
  // The tickets drawn out of band (draw steps) so far.
  let drawn = 0n;
  try {
    client = new (echoPackage().Echo)(`rota:///${service}`, grpc.credentials.createInsecure(), {
      [OPTION_SERVER]: fleet.server.target,
      [OPTION_RULE]: sc.rule,
      [OPTION_TICKET_HEADER]: true,
      [OPTION_LOGGER]: silentLogger,
      [OPTION_BACKOFF]: { initialMs: 20, maxMs: 500 },
    });
    for (const [i, s] of sc.steps.entries()) {
      if (s.calls !== undefined) {
        const deadline = s.deadline_ms ?? 5_000;
        const before = log.length;
        const others = Array.from({ length: Math.max(s.consumers ?? 1, 1) - 1 }, () =>
          runProcess(consumer.command, consumer.args(`rota://${fleet.server.target}/${service}`, sc.rule, s.calls!, s.version ?? '', deadline)),
        );
        const mine = await echoCalls(client, s.calls, s.version ?? '', deadline);
        const theirs = await Promise.all(others);
        for (const r of theirs) {
          assert.equal(r.length, s.calls, `step ${i}: a consumer process made ${r.length} calls`);
        }
        const weights = new Map(sc.instances.flatMap((inst) => (inst.weight !== undefined ? [[inst.id, inst.weight] as const] : [])));
        try {
          checkExpect(sc.rule, s.expect, weights, [...mine, ...theirs.flat()], log.slice(before), drawn);
          if (s.expect?.reported === true) {
            await checkReported(fleet.server.admin, sc.instances, log);
          }
        } catch (e) {
          throw new Error(`step ${i}: ${(e as Error).message}`, { cause: e });
        }
      } else if (s.withdraw !== undefined) {
        await fleet.withdraw(s.withdraw);
        const withdrawn = performance.now();
        const bound = s.within_ms ?? 1_000;
        const late: number[] = [];
        let afterBound = 0;
        while (performance.now() - withdrawn <= bound || afterBound < 20) {
          const started = performance.now() - withdrawn;
          const [r] = await echoCalls(client, 1, '', 5_000);
          assert.equal(r!.error, undefined, `step ${i}: a call failed after the withdrawal`);
          if (started > bound) {
            afterBound++;
            if (r!.instance === s.withdraw) {
              late.push(Math.round(started));
            }
          }
        }
        assert.deepEqual(late, [], `step ${i}: ${s.withdraw} still received calls started ms after its withdrawal`);
      } else if (s.kill !== undefined) {
        fleet.echoes.get(s.kill)!.kill();
        // A call already on its way to the instance may fail. As many calls in a row as there
        // are instances span a pick of the killed one, which the channel can only have passed
        // over: then it has seen the death.
        const want = sc.instances.length;
        let inARow = 0;
        for (let n = 0; n < 10 * want && inARow < want; n++) {
          inARow = (await echoCalls(client, 1, '', 5_000))[0]!.error === undefined ? inARow + 1 : 0;
        }
        assert.equal(inARow, want, `step ${i}: ${want} calls in a row did not succeed after ${s.kill} was killed`);
      } else if (s.hang !== undefined) {
        const echo = fleet.echoes.get(s.hang);
        assert.ok(echo !== undefined, `step ${i}: ${s.hang} has no echo server to hang`);
        echo.hang();
      } else if (s.stop_rota) {
        await fleet.stopRota();
      } else if (s.restart_rota) {
        // As a restarted rota in service runs: with a start-up warm-up, so that it answers
        // no lease while the providers are still registering again.
        await fleet.restartRota(RESTART_ARGS);
      } else if (s.await_leases) {
        const before = log.length;
        await waitFor(
          async () => {
            await echoCalls(client!, 1, '', 5_000);
            return log.slice(before).some((c) => c.ticket >= 0n);
          },
          { timeoutMs: s.within_ms ?? 20_000, what: 'a leased call' },
        );
      } else if (s.draw !== undefined) {
        drawn += BigInt(await drawOutOfBand(fleet.server.target, service, sc.rule, s.draw));
      } else {
        assert.fail(`step ${i}: no action`);
      }
    }
  } finally {
    client?.close();
    await fleet.close();
  }
}

/** Flags of a restarted rota: a warm-up whose settle period outlasts the providers' re-registration. */
const RESTART_ARGS = ['--warmup', '10s', '--warmup-settle', '500ms'];

describe(`channel scenarios (second consumer: ${consumer.language} process)`, { timeout: 600_000 }, () => {
  const files = readdirSync(scenarioDir).filter((f) => f.endsWith('.json')).sort();
  it('has scenarios', () => assert.ok(files.length > 0));
  for (const file of files) {
    const sc = JSON.parse(readFileSync(join(scenarioDir, file), 'utf8')) as Scenario;
    it(`${file}: ${sc.name}`, { timeout: 180_000 }, () => runScenario(sc));
  }
});

describe('channel scenario runner self-checks', { timeout: 120_000 }, () => {
  const two = [{ id: 'echo-a' }, { id: 'echo-b' }];

  it('rejects keys the format does not define', async () => {
    const base: Scenario = { name: 'self-check', rule: 'round_robin', instances: two, steps: [{ calls: 2, expect: { failures: 0 } }] };
    const misspelt = (patch: object): Scenario => JSON.parse(JSON.stringify({ ...base, ...patch })) as Scenario;
    await assert.rejects(runScenario(misspelt({ polcy: {} })), /unknown key "polcy" in scenario/);
    await assert.rejects(runScenario(misspelt({ instances: [{ id: 'echo-a', verison: 'v2' }] })), /unknown key "verison" in instance/);
    await assert.rejects(runScenario(misspelt({ steps: [{ calls: 2, expect: { count: { 'echo-a': 1 } } }] })), /unknown key "count" in step 0 expect/);
    await assert.rejects(runScenario(misspelt({ steps: [{ calls: 2, deadline: 100 }] })), /unknown key "deadline" in step 0/);
    await assert.rejects(runScenario(misspelt({ steps: [{ calls: 2, expect: { report: true } }] })), /unknown key "report" in step 0 expect/);
    await assert.rejects(runScenario(misspelt({ steps: [{ cals: 2 }] })), /step 0 has 0 actions/);
    await assert.rejects(runScenario(misspelt({ policy: { gray: { unversioned: 1, version: { v2: 1 } } } })), /unknown key "version" in policy\.gray/);
    await assert.rejects(runScenario(misspelt({ policy: { service: 'echo' } })), /policy names its service/);
    await assert.rejects(runScenario(misspelt({ steps: [{ drwa: 7 }] })), /step 0 has 0 actions .*its keys: "drwa"/);
    await assert.rejects(runScenario(misspelt({ steps: [{ draw: 7, within_ms: 5 }] })), /unknown key "within_ms" in step 0/);
  });

  it('fails a rotation expectation with a ticket drawn out of band before the step', () => {
    // Tickets 7..12 after 7 drawn out of band follow round robin over three ids; ticket 5, which
    // a channel counting from 0 by itself would send, maps to its instance but was drawn already.
    const ids = ['a', 'b', 'c'];
    const calls = [7n, 8n, 9n, 10n, 11n, 12n].map((ticket) => ({ instance: ids[Number(ticket % 3n)]!, ticket }));
    checkRotation('round_robin', ids, new Map(), calls, 7n);
    const low = [{ instance: 'c', ticket: 5n }, ...calls];
    assert.throws(() => checkRotation('round_robin', ids, new Map(), low, 7n), /carried ticket 5, one of the 7 tickets drawn out of band/);
    const results = low.map((c) => ({ instance: c.instance }));
    assert.throws(() => checkExpect('round_robin', { rotation: ids }, new Map(), results, low, 7n), /one of the 7 tickets drawn out of band/);
    checkExpect('round_robin', { rotation: ids }, new Map(), results, low, 5n);
  });

  it('reads proto JSON policies: proto and JSON field names, map keys as they are', () => {
    assert.deepEqual(policyMessage({ isolation_fallback: 'ISOLATION_FALLBACK_ANY', gray: { unversioned: 2, versions: { v_2: 1 } }, breaker: { failureThreshold: 5 } }), {
      isolationFallback: 'ISOLATION_FALLBACK_ANY',
      gray: { unversioned: 2, versions: { v_2: 1 } },
      breaker: { failureThreshold: 5 },
    });
  });

  it('fails a counts expectation the calls do not meet', async () => {
    const counted = (counts: Record<string, number>): Scenario => ({ name: 'self-check', rule: 'round_robin', instances: two, steps: [{ calls: 4, expect: { failures: 0, counts } }] });
    await runScenario(counted({ 'echo-a': 2, 'echo-b': 2 }));
    await assert.rejects(runScenario(counted({ 'echo-a': 3, 'echo-b': 1 })), /step 0: calls per instance/);
    await assert.rejects(runScenario(counted({ 'echo-a': 2 })), /step 0: calls per instance/);
    await runScenario(counted({ 'echo-a': 2, 'echo-b': 2, 'echo-c': 0 }));
  });

  it('fails a balanced expectation the calls do not meet', async () => {
    // weighted 3:1 over 8 calls: 6 and 2, more than max(2, 8/10) apart.
    const skewed: Scenario = {
      name: 'self-check',
      rule: 'weighted',
      instances: [
        { id: 'echo-a', weight: 300 },
        { id: 'echo-b', weight: 100 },
      ],
      steps: [{ calls: 8, expect: { failures: 0, only: ['echo-a', 'echo-b'], balanced: true } }],
    };
    await assert.rejects(runScenario(skewed), /step 0: balanced: echo-a 6, echo-b 2 differ by more than 2/);
    await runScenario({ ...skewed, rule: 'round_robin' });
    // An id of `only` that answered nothing is not balanced.
    await assert.rejects(
      runScenario({ ...skewed, rule: 'round_robin', steps: [{ calls: 8, expect: { only: ['echo-a', 'echo-b', 'echo-c'], balanced: true } }] }),
      /balanced: an instance answered no call/,
    );
  });
});
