// The xDS scenarios (clients/conformance/xds) with grpc-js's own xDS client, @grpc/grpc-js-xds,
// and rota as its control plane. Each scenario gets the fleet of the channel scenarios
// (scenario.ts: a `rota serve` on a free loopback port, an echo server and a registration per
// instance) and, as its consumer, a process of its own (xds-consumer.ts) with a channel to
// xds:///echo whose bootstrap, written here, names that rota and nothing else: the xDS client is
// one per process and reads its bootstrap once. A `restart_rota` step starts rota again with its
// warm-up on (the harness turns it off for fresh servers), so that the restarted rota withholds
// the service until the providers are back rather than telling the clients it is gone.
//
// The consumers trace the xDS client and resolver (GRPC_NODE_TRACE=xds_client,xds_resolver,
// GRPC_NODE_VERBOSITY=DEBUG, unless the environment sets GRPC_NODE_TRACE); a failed scenario's
// message ends with the last of what its consumer logged and names the file that keeps the rest.

import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import { rotaV1 } from '../src/proto.js';
import { keyName, type EchoResult } from './echo.js';
import { packageDir, repoRoot } from './harness.js';
import { Fleet, checkExpect, checkKeys, policyMessage, type Expect, type ScenarioInstance } from './scenario.js';
import type { ConsumerOutcome, ConsumerRequest } from './xds-consumer.js';

interface XdsExpect extends Expect {
  codes?: string[];
  /** Every answered call carried a key, and all with the same key reached one instance (across the step's consumers). */
  keyed?: boolean;
}

interface XdsStep {
  calls?: number;
  consumers?: number;
  /** Call i of each consumer sends x-rota-key: key-(i mod keys). */
  keys?: number;
  version?: string;
  deadline_ms?: number;
  expect?: XdsExpect;
  withdraw?: string;
  drain?: string;
  trip?: string;
  within_ms?: number;
  kill?: string;
  hang?: string;
  stop_rota?: boolean;
  restart_rota?: boolean;
}

interface XdsScenario {
  name: string;
  service?: string;
  instances: ScenarioInstance[];
  policy?: Record<string, unknown>;
  /** Needs rota's own load-balancing policy registered in the client (Go and Java only). */
  rota_policy?: boolean;
  steps: XdsStep[];
}

const scenarioDir = join(repoRoot, 'clients', 'conformance', 'xds');

/**
 * Scenarios not run, each with the one-line reason: a scenario that fails because of rota's
 * xDS server (not this runner) is listed here rather than left failing.
 */
const SKIP: Readonly<Record<string, string>> = {};

/**
 * Why a `"rota_policy": true` scenario is not run here: rota's own policy
 * (`rota.v1.CentralRotation`) exists for Go and Java only; grpc-js-xds takes the standard
 * policy after it in rota's clusters.
 */
const NO_ROTA_POLICY = "needs rota's own policy (rota.v1.CentralRotation), which exists for Go and Java only";

// The keys of clients/conformance/xds/README.md: the channel format's without `rule` and the
// ticket expectations (`leased`, `rotation`, `runs`), with `drain`, `trip`, the `keys` of
// `calls`, `codes` and `keyed`.
const SCENARIO_KEYS = new Set(['name', 'service', 'instances', 'policy', 'rota_policy', 'steps']);
const INSTANCE_KEYS = new Set(['id', 'version', 'weight', 'unreachable']);
const EXPECT_KEYS = new Set(['failures', 'error_contains', 'only', 'never', 'spread', 'counts', 'balanced', 'codes', 'keyed']);
/** Each step's action key and the keys that may go with it. */
const STEP_KEYS: Record<string, ReadonlySet<string>> = {
  calls: new Set(['calls', 'consumers', 'version', 'deadline_ms', 'keys', 'expect']),
  withdraw: new Set(['withdraw', 'within_ms', 'version']),
  drain: new Set(['drain', 'within_ms', 'version']),
  trip: new Set(['trip', 'within_ms', 'version']),
  kill: new Set(['kill']),
  hang: new Set(['hang']),
  stop_rota: new Set(['stop_rota']),
  restart_rota: new Set(['restart_rota']),
};

/** Fails on a key the xDS scenario format does not define, anywhere in the scenario. */
function checkScenario(sc: XdsScenario): void {
  checkKeys('scenario', sc, SCENARIO_KEYS);
  assert.ok(sc.rota_policy === undefined || typeof sc.rota_policy === 'boolean', 'rota_policy must be true or false');
  for (const inst of sc.instances) {
    checkKeys('instance', inst, INSTANCE_KEYS);
  }
  if (sc.policy !== undefined) {
    policyMessage(sc.policy);
  }
  for (const [i, step] of sc.steps.entries()) {
    const actions = Object.keys(step).filter((k) => k in STEP_KEYS);
    assert.equal(actions.length, 1, `step ${i} has ${actions.length} actions (${actions.join(', ')}), want one of ${Object.keys(STEP_KEYS).join(', ')}`);
    checkKeys(`step ${i}`, step, STEP_KEYS[actions[0]!]!);
    // rotation (tickets checked) only where rota's own policy hands tickets out.
    checkKeys(`step ${i} expect`, step.expect, sc.rota_policy === true ? new Set([...EXPECT_KEYS, 'rotation']) : EXPECT_KEYS);
    for (const code of step.expect?.codes ?? []) {
      assert.ok(typeof grpc.status[code as keyof typeof grpc.status] === 'number', `step ${i}: ${code} is no status code name`);
    }
    assert.ok(step.keys === undefined || (Number.isInteger(step.keys) && step.keys >= 1), `step ${i}: keys must be a count of at least 1`);
    // As read from the file: anything but true (or nothing) is refused.
    const keyed: unknown = step.expect?.keyed;
    assert.ok(keyed === undefined || keyed === true, `step ${i}: keyed can only be true`);
    assert.ok(keyed === undefined || step.keys !== undefined, `step ${i} expects keyed calls and sends no keys`);
  }
}

/** The bootstrap of the README: the rota at `target` as the only xDS server. */
function bootstrap(target: string): string {
  return JSON.stringify({
    xds_servers: [{ server_uri: target, channel_creds: [{ type: 'insecure' }], server_features: ['xds_v3'] }],
    node: { id: 'conformance-node', locality: {} },
  });
}

const CONSUMER_SCRIPT = join(packageDir, 'build', 'test', 'xds-consumer.js');
/** The warm-up of a restarted rota: rota's default, its heartbeat timeout. */
const RESTART_WARMUP = '20s';
/** The most a scenario may take: then its consumer is killed, which fails the step under way. */
const SCENARIO_BUDGET_MS = 45_000;
const STDERR_KEPT = 2_000_000;

/** A consumer process (xds-consumer.ts): one xDS channel, calls on request. */
class XdsConsumer {
  readonly #child: ChildProcess;
  readonly #lines: AsyncIterator<string>;
  readonly #exited: Promise<void>;
  #stderr = '';
  #killedBecause = '';

  private constructor(child: ChildProcess) {
    this.#child = child;
    this.#exited = new Promise((resolve) => child.once('exit', () => resolve()));
    child.stderr!.setEncoding('utf8');
    child.stderr!.on('data', (chunk: string) => {
      this.#stderr = (this.#stderr + chunk).slice(-STDERR_KEPT);
    });
    this.#lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
    // A request written after the process died fails as the end of its output, in calls().
    child.stdin!.on('error', () => {});
  }

  /** Starts a consumer of xds:///`service` with the bootstrap file `bootstrapFile`. */
  static start(bootstrapFile: string, service: string): XdsConsumer {
    const env: NodeJS.ProcessEnv = { ...process.env, GRPC_XDS_BOOTSTRAP: bootstrapFile };
    delete env['GRPC_XDS_BOOTSTRAP_CONFIG'];
    if (env['GRPC_NODE_TRACE'] === undefined) {
      env['GRPC_NODE_TRACE'] = 'xds_client,xds_resolver';
      env['GRPC_NODE_VERBOSITY'] = 'DEBUG';
    }
    const consumer = new XdsConsumer(spawn(process.execPath, [CONSUMER_SCRIPT, service], { env, stdio: ['pipe', 'pipe', 'pipe'] }));
    running.add(consumer);
    return consumer;
  }

  /** What the process logged last (its stderr), for failure messages. */
  get log(): string {
    return this.#stderr;
  }

  /**
   * `n` unary Echo calls, one after another, each with deadline `deadlineMs` (with
   * `stopOnFailure`, none after the first that fails); bounded in all.
   */
  async calls(n: number, version: string, deadlineMs: number, stopOnFailure = false, keys = 0): Promise<KeyedResult[]> {
    const request: ConsumerRequest = { calls: n, version, deadline_ms: deadlineMs, keys, stop_on_failure: stopOnFailure };
    this.#child.stdin!.write(`${JSON.stringify(request)}\n`);
    const boundMs = n * deadlineMs + 10_000;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`the xDS consumer did not answer ${n} calls within ${boundMs} ms`)), boundMs);
    });
    let line: IteratorResult<string>;
    try {
      line = await Promise.race([this.#lines.next(), timeout]);
    } finally {
      clearTimeout(timer);
    }
    assert.ok(line.done !== true, `the xDS consumer exited (${this.#child.exitCode ?? this.#child.signalCode}${this.#killedBecause})`);
    const outcomes = JSON.parse(line.value) as ConsumerOutcome[];
    const stopped = stopOnFailure && outcomes.at(-1) !== undefined && !('instance' in outcomes.at(-1)!);
    assert.ok(outcomes.length === n || (stopped && outcomes.length < n), `the xDS consumer answered ${outcomes.length} of ${n} calls`);
    return outcomes.map((o, i) => ({
      ...('instance' in o ? { instance: o.instance } : { error: Object.assign(new Error(o.details), { code: o.code, details: o.details, metadata: new grpc.Metadata() }) }),
      key: keyName(i, keys),
    }));
  }

  /** Ends the process: the end of its stdin, then SIGKILL after 5 s. */
  async close(): Promise<void> {
    running.delete(this);
    if (this.#child.exitCode === null && this.#child.signalCode === null) {
      this.#child.stdin!.end();
      const timer = setTimeout(() => this.#child.kill('SIGKILL'), 5_000);
      await this.#exited;
      clearTimeout(timer);
    }
  }

  /** Kills the process at once; `why` goes into the message of the calls that were waiting. */
  kill(why = ''): void {
    this.#killedBecause = why === '' ? '' : `: ${why}`;
    this.#child.kill('SIGKILL');
  }
}

const running = new Set<XdsConsumer>();
process.on('exit', () => {
  for (const consumer of running) {
    consumer.kill();
  }
});

/** A call's outcome with the x-rota-key it sent (none when its batch had no keys). */
interface KeyedResult extends EchoResult {
  key: string | undefined;
}

/**
 * The `keyed` expectation: every answered call carried a key, and all answered calls with the
 * same key (over every consumer of the step) reached one instance.
 */
function checkKeyed(results: readonly KeyedResult[]): void {
  const byKey = new Map<string, Map<string, number>>();
  for (const r of results) {
    if (r.error !== undefined) {
      continue;
    }
    assert.ok(r.key !== undefined, `keyed: a call to ${r.instance} carried no key`);
    const reached = byKey.get(r.key) ?? new Map<string, number>();
    reached.set(r.instance!, (reached.get(r.instance!) ?? 0) + 1);
    byKey.set(r.key, reached);
  }
  assert.ok(byKey.size > 0, 'keyed: no call was answered');
  const split = [...byKey]
    .filter(([, reached]) => reached.size > 1)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([key, reached]) => `${key} reached ${JSON.stringify(Object.fromEntries([...reached].sort()))}`);
  assert.deepEqual(split, [], `keyed: ${split.length} of ${byKey.size} keys reached more than one instance`);
}

/** One line per failed call kind, `N × CODE details`. */
function failureKinds(results: readonly EchoResult[]): string {
  const kinds = new Map<string, number>();
  for (const r of results) {
    if (r.error !== undefined) {
      const kind = `${grpc.status[r.error.code]} ${r.error.details}`;
      kinds.set(kind, (kinds.get(kind) ?? 0) + 1);
    }
  }
  return [...kinds].map(([kind, n]) => `${n} × ${kind}`).join('; ');
}

/**
 * The last 40 lines of a consumer's log that start a record (grpc-js's `D 2026-…` trace lines,
 * anything else it wrote), each cut at 300 characters: the traced resources that follow a record
 * run to thousands of lines.
 */
function logTail(log: string): string {
  return log
    .split('\n')
    .filter((line) => line !== '' && !line.startsWith(' ') && line !== '}' && line !== ']')
    .slice(-40)
    .map((line) => (line.length > 300 ? `${line.slice(0, 300)}…` : line))
    .join('\n');
}

/** The service's breaker threshold: the policy's `breaker.failureThreshold`, else rota's default 3. */
function breakerThreshold(policy: Record<string, unknown> | undefined): number {
  const breaker = policy === undefined ? undefined : (policyMessage(policy)['breaker'] as { failureThreshold?: number } | undefined);
  const threshold = breaker?.failureThreshold ?? 0;
  return threshold > 0 ? threshold : 3;
}

/** Reports `count` failed calls of instance `id` (leased: routed by no Pick), as a fleet's channels would. */
async function reportFailures(target: string, service: string, id: string, count: number): Promise<void> {
  const balancer = new (rotaV1().Balancer)(target, grpc.credentials.createInsecure());
  try {
    const outcomes = Array.from({ length: count }, () => ({ service, instanceId: id, latencyUs: 1_000, result: 'CALL_RESULT_ERROR' as const, leased: true }));
    const accepted = await new Promise<number>((resolve, reject) =>
      balancer.Report({ outcomes }, { deadline: Date.now() + 5_000 }, (error, response) => (error !== null ? reject(new Error(`Report: ${error.details}`)) : resolve(response!.accepted))),
    );
    assert.equal(accepted, count, `rota accepted ${accepted} of ${count} failures of ${id}`);
  } finally {
    balancer.close();
  }
}

/**
 * Calls through `consumer` until `boundMs` have passed since `since` and at least 20 more calls
 * were made; fails on a failed call, or on a call that started later than `boundMs` after `since`
 * and reached `id`.
 */
async function noneReachAfter(consumer: XdsConsumer, id: string, what: string, since: number, boundMs: number, version: string): Promise<void> {
  const late: number[] = [];
  let afterBound = 0;
  while (performance.now() - since <= boundMs || afterBound < 20) {
    const started = performance.now() - since;
    const [r] = await consumer.calls(1, version, 5_000);
    assert.ok(r!.error === undefined, `a call failed after ${id} was ${what}: ${failureKinds([r!])}`);
    if (started > boundMs) {
      afterBound++;
      if (r!.instance === id) {
        late.push(Math.round(started));
      }
    }
  }
  assert.deepEqual(late, [], `${id} still received calls started these ms after it was ${what}`);
}

/** Runs one xDS scenario against a rota of its own; rejects at the first unmet expectation. */
async function runScenario(sc: XdsScenario): Promise<void> {
  checkScenario(sc);
  const service = sc.service ?? 'echo';
  const fleet = await Fleet.start(sc.instances, { service, ...(sc.policy !== undefined ? { policy: sc.policy } : {}) });
  // Written once: a restarted rota listens on the same address.
  const dir = mkdtempSync(join(tmpdir(), 'rota-xds-'));
  const bootstrapFile = join(dir, 'bootstrap.json');
  writeFileSync(bootstrapFile, bootstrap(fleet.server.target));
  const consumer = XdsConsumer.start(bootstrapFile, service);
  const budget = setTimeout(() => consumer.kill(`the scenario ran past its ${SCENARIO_BUDGET_MS} ms`), SCENARIO_BUDGET_MS);
  let step = 0;
  try {
    for (const [i, s] of sc.steps.entries()) {
      step = i;
      if (s.calls !== undefined) {
        const deadline = s.deadline_ms ?? 5_000;
        const before = fleet.log.length;
        const others = Array.from({ length: Math.max(s.consumers ?? 1, 1) - 1 }, () => XdsConsumer.start(bootstrapFile, service));
        let results: KeyedResult[];
        try {
          // A step that wants no failure stops at the first: the rest could only wait out deadlines.
          const stopOnFailure = s.expect?.failures === 0;
          results = (await Promise.all([consumer, ...others].map((c) => c.calls(s.calls!, s.version ?? '', deadline, stopOnFailure, s.keys ?? 0)))).flat();
        } finally {
          await Promise.all(others.map((c) => c.close()));
        }
        const weights = new Map(sc.instances.flatMap((inst) => (inst.weight !== undefined ? [[inst.id, inst.weight] as const] : [])));
        checkExpect('', s.expect, weights, results, fleet.log.slice(before));
        if (s.expect?.keyed === true) {
          checkKeyed(results);
        }
        const codes = s.expect?.codes;
        if (codes !== undefined) {
          for (const r of results) {
            if (r.error !== undefined) {
              assert.ok(codes.includes(grpc.status[r.error.code]), `a call failed ${grpc.status[r.error.code]} (${r.error.details}), not ${codes.join(' or ')}`);
            }
          }
        }
      } else if (s.withdraw !== undefined) {
        await fleet.withdraw(s.withdraw);
        await noneReachAfter(consumer, s.withdraw, 'withdrawn', performance.now(), s.within_ms ?? 1_000, s.version ?? '');
      } else if (s.drain !== undefined) {
        const ack = await fleet.registration(s.drain).update({ service: 'echo', id: s.drain }, { status: 'DRAINING' });
        assert.deepEqual(
          ack.accepted.map((ref) => ref.id),
          [s.drain],
          `rota did not accept ${s.drain} as DRAINING (refused: ${JSON.stringify(ack.refused)})`,
        );
        await noneReachAfter(consumer, s.drain, 'DRAINING', performance.now(), s.within_ms ?? 1_000, s.version ?? '');
      } else if (s.trip !== undefined) {
        await reportFailures(fleet.server.target, 'echo', s.trip, breakerThreshold(sc.policy));
        await noneReachAfter(consumer, s.trip, 'tripped', performance.now(), s.within_ms ?? 1_000, s.version ?? '');
      } else if (s.kill !== undefined) {
        fleet.echoes.get(s.kill)!.kill();
        // As for the channel scenarios: a call on its way to the instance may fail; as many
        // calls in a row as there are instances then succeed.
        const want = sc.instances.length;
        let inARow = 0;
        for (let n = 0; n < 10 * want && inARow < want; n++) {
          inARow = (await consumer.calls(1, '', 5_000))[0]!.error === undefined ? inARow + 1 : 0;
        }
        assert.equal(inARow, want, `${want} calls in a row did not succeed after ${s.kill} was killed`);
      } else if (s.hang !== undefined) {
        const echo = fleet.echoes.get(s.hang);
        assert.ok(echo !== undefined, `${s.hang} has no echo server to hang`);
        echo.hang();
      } else if (s.stop_rota) {
        await fleet.stopRota();
      } else if (s.restart_rota) {
        // With rota's own warm-up (its default, the heartbeat timeout), which the harness turns
        // off for fresh servers: until the providers are back, the restarted rota withholds the
        // service's resources, so the clients keep theirs. Without it, a client that subscribes
        // again before the registrations return is told that the listener no longer exists.
        await fleet.restartRota(['--warmup', RESTART_WARMUP]);
      } else {
        assert.fail('no action');
      }
    }
    rmSync(dir, { recursive: true, force: true });
  } catch (e) {
    const logFile = join(dir, 'consumer.log');
    writeFileSync(logFile, consumer.log);
    throw new Error(`step ${step}: ${(e as Error).message}\n--- the xDS consumer's last log lines (all of its log in ${logFile}):\n${logTail(consumer.log)}`, { cause: e });
  } finally {
    clearTimeout(budget);
    await consumer.close();
    await fleet.close();
  }
}

const xdsVersion = (JSON.parse(readFileSync(join(packageDir, 'node_modules', '@grpc', 'grpc-js-xds', 'package.json'), 'utf8')) as { version: string }).version;

describe(`xDS scenarios (@grpc/grpc-js-xds ${xdsVersion}, a consumer process per scenario)`, { timeout: 170_000 }, () => {
  const files = readdirSync(scenarioDir).filter((f) => f.endsWith('.json')).sort();
  it('has scenarios', () => assert.ok(files.length > 0));
  for (const file of files) {
    const sc = JSON.parse(readFileSync(join(scenarioDir, file), 'utf8')) as XdsScenario;
    const skip = SKIP[file] ?? (sc.rota_policy === true ? NO_ROTA_POLICY : undefined);
    it(`${file}: ${sc.name}`, { timeout: 60_000, ...(skip !== undefined ? { skip } : {}) }, () => runScenario(sc));
  }
  it('every scenario follows the format, skipped ones too', () => {
    for (const file of files) {
      checkScenario(JSON.parse(readFileSync(join(scenarioDir, file), 'utf8')) as XdsScenario);
    }
  });
  it('skips only scenarios that exist', () => {
    for (const file of Object.keys(SKIP)) {
      assert.ok(files.includes(file), `SKIP names ${file}, which clients/conformance/xds does not have`);
    }
  });
});

describe('xDS scenario runner self-checks', () => {
  const base: XdsScenario = { name: 'self-check', instances: [{ id: 'echo-a' }], steps: [{ calls: 2, expect: { failures: 0 } }] };
  const patched = (patch: object): XdsScenario => JSON.parse(JSON.stringify({ ...base, ...patch })) as XdsScenario;

  it('rejects keys the format does not define, before starting anything', async () => {
    await assert.rejects(runScenario(patched({ rule: 'round_robin' })), /unknown key "rule" in scenario/);
    await assert.rejects(runScenario(patched({ rota_policy: 'yes' })), /rota_policy must be true or false/);
    await assert.rejects(runScenario(patched({ steps: [{ calls: 2, expect: { rotation: ['echo-a'] } }] })), /unknown key "rotation" in step 0 expect/);
    await assert.rejects(runScenario(patched({ steps: [{ await_leases: true }] })), /step 0 has 0 actions/);
    await assert.rejects(runScenario(patched({ steps: [{ drain: 'echo-a', within: 100 }] })), /unknown key "within" in step 0/);
    await assert.rejects(runScenario(patched({ steps: [{ calls: 2, expect: { codes: ['UNAVAILBLE'] } }] })), /UNAVAILBLE is no status code name/);
    await assert.rejects(runScenario(patched({ policy: { breaker: { failureThreshhold: 5 } } })), /unknown key "failureThreshhold" in policy\.breaker/);
    await assert.rejects(runScenario(patched({ steps: [{ calls: 2, key: 2 }] })), /unknown key "key" in step 0/);
    await assert.rejects(runScenario(patched({ steps: [{ calls: 2, keys: 0 }] })), /step 0: keys must be a count of at least 1/);
    await assert.rejects(runScenario(patched({ steps: [{ withdraw: 'echo-a', keys: 2 }] })), /unknown key "keys" in step 0/);
    await assert.rejects(runScenario(patched({ steps: [{ calls: 2, expect: { keyed: true } }] })), /step 0 expects keyed calls and sends no keys/);
    await assert.rejects(runScenario(patched({ steps: [{ calls: 2, keys: 2, expect: { keyed: false } }] })), /step 0: keyed can only be true/);
  });

  it('keyed holds only when each key reached one instance', () => {
    const ok = (instance: string, i: number, keys: number): KeyedResult => ({ instance, key: keyName(i, keys) });
    const failed: KeyedResult = { error: Object.assign(new Error('x'), { code: grpc.status.UNAVAILABLE, details: 'x', metadata: new grpc.Metadata() }), key: 'key-0' };
    checkKeyed([ok('echo-a', 0, 2), ok('echo-b', 1, 2), failed, ok('echo-a', 2, 2), ok('echo-b', 3, 2)]);
    assert.throws(() => checkKeyed([ok('echo-a', 0, 2), ok('echo-b', 1, 2), ok('echo-b', 2, 2)]), /keyed: 1 of 2 keys reached more than one instance/);
    // Round robin over three instances with two keys: both keys reach several.
    assert.throws(() => checkKeyed(['echo-a', 'echo-b', 'echo-c', 'echo-a'].map((id, i) => ok(id, i, 2))), /keyed: 2 of 2 keys/);
    assert.throws(() => checkKeyed([ok('echo-a', 0, 0)]), /carried no key/);
    assert.throws(() => checkKeyed([failed]), /no call was answered/);
    assert.equal(keyName(7, 3), 'key-1');
    assert.equal(keyName(7, 0), undefined);
  });

  it('keyed fails under round robin, which takes no notice of the key', async () => {
    // No hashing rule: rota's clusters name round_robin. 7 keys share no factor with the 3 (or,
    // while one connection is on its way, 2) instances it rotates over.
    const roundRobin = patched({
      instances: [{ id: 'echo-a' }, { id: 'echo-b' }, { id: 'echo-c' }],
      steps: [
        { calls: 30, keys: 10, expect: { failures: 0 } },
        { calls: 49, keys: 7, expect: { failures: 0, keyed: true } },
      ],
    });
    await assert.rejects(runScenario(roundRobin), /step 1: keyed: \d+ of 7 keys reached more than one instance/);
  });

  it("reads the breaker threshold from the scenario's policy", () => {
    assert.equal(breakerThreshold(undefined), 3);
    assert.equal(breakerThreshold({ breaker: { failure_threshold: 5 } }), 5);
    assert.equal(breakerThreshold({ breaker: { failureThreshold: 0 } }), 3);
  });
});
