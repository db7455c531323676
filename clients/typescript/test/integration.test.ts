// The client against live `rota serve` processes: one shared server, plus servers of their own
// for the tests that kill one.

import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer as createTcpServer, type AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';

import {
  RegistrationRefusedError,
  RotaClient,
  RotaError,
  status,
  withVersion,
  type Ack,
  type Instance,
  type WatchEvent,
} from '../src/index.js';
import { CapturingLogger, RotaServer, nextEvent, silentLogger, waitFor } from './harness.js';

function expectRotaError(code: status, check: (error: RotaError) => void = () => {}) {
  return (error: unknown) => {
    assert.ok(error instanceof RotaError, `expected a RotaError, got ${String(error)}`);
    assert.equal(error.code, code, `code of ${error.message}`);
    check(error);
    return true;
  };
}

function plain(service: string, id: string, port: number, fields: Partial<Instance> = {}): Instance {
  return { id, service, host: '127.0.0.1', port, version: '', zone: '', weight: 100, metadata: {}, status: 'UP', ...fields };
}

async function freePort(): Promise<number> {
  const server = createTcpServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as AddressInfo;
  server.close();
  await once(server, 'close');
  return port;
}

describe('against a live rota', () => {
  let server: RotaServer;
  let consumer: RotaClient;
  let provider: RotaClient;

  before(async () => {
    server = await RotaServer.start();
    consumer = await RotaClient.connect(server.target, { logger: silentLogger });
    provider = new RotaClient(server.target, { logger: silentLogger });
  });

  after(async () => {
    await consumer?.close();
    await provider?.close();
    await server?.stop();
  });

  it('picks what register() registered', async () => {
    const service = 'it-register';
    const registration = await provider.register([
      { service, id: 'p1', host: '127.0.0.1', port: 7001, zone: 'z1', metadata: { build: '42' } },
      { service, host: '127.0.0.1', port: 7002 },
    ]);
    try {
      assert.deepEqual(registration.ack.accepted, [
        { service, id: 'p1' },
        { service, id: '127.0.0.1:7002' },
      ]);
      assert.deepEqual(registration.ack.refused, []);
      assert.equal(registration.ack.seq, 1n);
      assert.equal(registration.ack.heartbeatTimeoutMs, 15_000);
      assert.equal(registration.connected, true);
      assert.deepEqual(registration.instances, [
        { service, id: 'p1' },
        { service, id: '127.0.0.1:7002' },
      ]);

      // Rotation follows id order: "127.0.0.1:7002" sorts before "p1".
      const first = await consumer.pick(service);
      assert.equal(first.instance.id, '127.0.0.1:7002');
      assert.equal(first.ticket, 0n);
      const second = await consumer.pick(service);
      assert.deepEqual(second, {
        instance: plain(service, 'p1', 7001, { zone: 'z1', metadata: { build: '42' } }),
        ticket: 1n,
        rule: 'round_robin',
        fallback: '',
        epoch: 1n,
        localFallback: false,
      });
      // Six concurrent picks draw tickets 0..5 of the repeat(n=3) rotation, in whatever order
      // they are answered: each instance gets a run of three.
      const repeated = await Promise.all([1, 2, 3, 4, 5, 6].map(() => consumer.pick(service, { rule: 'repeat(n=3)' })));
      assert.deepEqual(
        repeated.sort((a, b) => (a.ticket < b.ticket ? -1 : a.ticket > b.ticket ? 1 : 0)).map((r) => `${r.ticket} ${r.instance.id} ${r.rule}`),
        [
          '0 127.0.0.1:7002 repeat(n=3)',
          '1 127.0.0.1:7002 repeat(n=3)',
          '2 127.0.0.1:7002 repeat(n=3)',
          '3 p1 repeat(n=3)',
          '4 p1 repeat(n=3)',
          '5 p1 repeat(n=3)',
        ],
      );
    } finally {
      await registration.close();
    }
  });

  it('withdraws on close(): the instances are gone right after', async () => {
    const service = 'it-close';
    const registration = await provider.register({ service, id: 'c1', host: '127.0.0.1', port: 7101 });
    assert.equal((await consumer.pick(service)).instance.id, 'c1');
    await registration.close();
    assert.equal(registration.closed, true);
    assert.equal(registration.connected, false);
    assert.deepEqual((await consumer.listInstances(service)).instances, []);
    await assert.rejects(
      consumer.pick(service),
      expectRotaError(status.UNAVAILABLE, (error) => assert.equal(error.unreachable, false)),
    );
    await assert.rejects(registration.announce({ service, id: 'c2', host: '127.0.0.1', port: 7102 }), expectRotaError(status.CANCELLED));
    await registration.close();
  });

  it('withdraws on asyncDispose', async () => {
    const service = 'it-dispose';
    {
      await using registration = await provider.register({ service, id: 'd1', host: '127.0.0.1', port: 7151 });
      assert.equal(registration.connected, true);
      assert.deepEqual(
        (await consumer.listInstances(service)).instances.map((i) => i.id),
        ['d1'],
      );
    }
    assert.deepEqual((await consumer.listInstances(service)).instances, []);
  });

  it('announces, updates and withdraws on an open registration', async () => {
    const service = 'it-update';
    const registration = await provider.register({ service, id: 'u1', host: '127.0.0.1', port: 7201 });
    try {
      const announced: Ack = await registration.announce({ service, id: 'u2', host: '127.0.0.1', port: 7202, weight: 5 });
      assert.equal(announced.seq, 2n);
      assert.deepEqual(announced.accepted, [{ service, id: 'u2' }]);

      const drained = await registration.update({ service, id: 'u1' }, { status: 'DRAINING', metadata: { why: 'deploy' } });
      assert.deepEqual(drained.accepted, [{ service, id: 'u1' }]);
      const list = await consumer.listInstances(service);
      assert.deepEqual(list.instances, [
        plain(service, 'u1', 7201, { status: 'DRAINING', metadata: { why: 'deploy' } }),
        plain(service, 'u2', 7202, { weight: 5 }),
      ]);
      assert.deepEqual(
        [(await consumer.pick(service)).instance.id, (await consumer.pick(service)).instance.id],
        ['u2', 'u2'],
      );

      const missing = await registration.update({ service, id: 'nobody' }, { status: 'DOWN' });
      assert.deepEqual(missing.accepted, []);
      assert.deepEqual(
        missing.refused.map((r) => [r.instance.id, r.code]),
        [['nobody', status.NOT_FOUND]],
      );

      const withdrawn = await registration.withdraw([{ service, id: 'u2' }]);
      assert.deepEqual(withdrawn.accepted, [{ service, id: 'u2' }]);
      assert.deepEqual(registration.instances, [{ service, id: 'u1' }]);
      assert.deepEqual(
        (await consumer.listInstances(service)).instances.map((i) => i.id),
        ['u1'],
      );
    } finally {
      await registration.close();
    }
  });

  it('rejects a refused registration and leaves nothing registered', async () => {
    const service = 'it-refused';
    const owner = await provider.register({ service, id: 'taken', host: '127.0.0.1', port: 7301 });
    try {
      await assert.rejects(
        provider.register([
          { service, id: 'fresh', host: '127.0.0.1', port: 7302 },
          { service, id: 'taken', host: '127.0.0.1', port: 7303 },
        ]),
        (error: unknown) => {
          assert.ok(error instanceof RegistrationRefusedError);
          assert.equal(error.code, status.ALREADY_EXISTS);
          assert.deepEqual(error.accepted, [{ service, id: 'fresh' }]);
          assert.deepEqual(
            error.refused.map((r) => [r.instance.id, r.code]),
            [['taken', status.ALREADY_EXISTS]],
          );
          return true;
        },
      );
      assert.deepEqual(
        (await consumer.listInstances(service)).instances.map((i) => [i.id, i.port]),
        [['taken', 7301]],
      );
    } finally {
      await owner.close();
    }
  });

  it('report() returns the accepted and ignored counts', async () => {
    const service = 'it-report';
    const registration = await provider.register({ service, id: 'r1', host: '127.0.0.1', port: 7401 });
    try {
      const picked = await consumer.pick(service);
      const counts = await consumer.report([
        { service, instanceId: 'r1', ticket: picked.ticket, rule: picked.rule, latencyUs: 1_500, result: 'OK' },
        { service, instanceId: 'r1', latencyUs: 90_000, result: 'ERROR' },
        { service, instanceId: 'ghost', latencyUs: 10, result: 'CONNECT_FAILURE' },
        { service: 'it-nowhere', instanceId: 'x', latencyUs: 10, result: 'OK' },
      ]);
      assert.deepEqual(counts, { accepted: 2, ignored: 2 });
      assert.deepEqual(await consumer.report({ service, instanceId: 'r1', latencyUs: 1, result: 'OK' }), { accepted: 1, ignored: 0 });

      assert.equal(await consumer.timed(picked, (instance) => instance.port * 2), 14_802);
      await assert.rejects(
        consumer.timed(picked, () => Promise.reject(new Error('boom'))),
        /boom/,
      );
    } finally {
      await registration.close();
    }
  });

  it('picks the current version, and errors carry the status', async () => {
    const service = 'it-version';
    const registration = await provider.register([
      { service, id: 'plain', host: '127.0.0.1', port: 7501 },
      { service, id: 'green', host: '127.0.0.1', port: 7502, version: 'green' },
    ]);
    try {
      assert.equal((await consumer.pick(service)).instance.id, 'plain');
      const green = await withVersion('green', () => consumer.pick(service));
      assert.equal(green.instance.id, 'green');
      assert.equal(green.fallback, '');
      assert.equal((await withVersion('green', () => consumer.pick(service, { version: '' }))).instance.id, 'plain');
      const other = await withVersion('blue', () => consumer.pick(service));
      assert.equal(other.instance.id, 'plain');
      assert.equal(other.fallback, 'no instance with version "blue"; picked from instances with no version');

      await assert.rejects(
        consumer.pick(service, { rule: 'zigzag' }),
        expectRotaError(status.INVALID_ARGUMENT, (error) => {
          assert.equal(error.codeName, 'INVALID_ARGUMENT');
          assert.match(error.details, /round_robin/);
          assert.equal(error.message, `INVALID_ARGUMENT: ${error.details}`);
        }),
      );
      await assert.rejects(consumer.pick('it-never-registered'), expectRotaError(status.NOT_FOUND));
      await assert.rejects(consumer.pick(service, { exclude: ['plain', 'green'] }), expectRotaError(status.UNAVAILABLE));
    } finally {
      await registration.close();
    }
  });

  it('lists services and watches one', async () => {
    const service = 'it-watch';
    const events: WatchEvent[] = [];
    const watching = (async () => {
      for await (const event of consumer.watch(service)) {
        events.push(event);
        if (events.length === 3) {
          break;
        }
      }
    })();
    await waitFor(() => events.length === 1, { what: 'the snapshot' });
    const registration = await provider.register({ service, id: 'w1', host: '127.0.0.1', port: 7601 });
    await registration.close();
    await watching;
    assert.deepEqual(events, [
      { type: 'snapshot', instances: [], epoch: 0n },
      { type: 'added', instance: plain(service, 'w1', 7601), epoch: 1n },
      { type: 'removed', instance: { service, id: 'w1' }, epoch: 2n },
    ]);
    const summary = (await consumer.listServices()).find((s) => s.name === service);
    assert.deepEqual(summary, { name: service, instances: 0, up: 0, epoch: 2n });
  });

  it('connect() rejects with UNAVAILABLE when nothing listens', async () => {
    const port = await freePort();
    await assert.rejects(
      RotaClient.connect(`127.0.0.1:${port}`, { connectTimeoutMs: 500, logger: silentLogger }),
      expectRotaError(status.UNAVAILABLE, (error) => assert.equal(error.unreachable, true)),
    );
  });
});

describe('when rota goes away', () => {
  it('picks from the watched list, flagged, once the server is killed', async () => {
    const server = await RotaServer.start();
    const logger = new CapturingLogger();
    const consumer = new RotaClient(server.target, { logger, pickTimeoutMs: 1_000 });
    const provider = new RotaClient(server.target, { logger: silentLogger });
    const service = 'it-fallback';
    try {
      await provider.register([
        { service, id: 'a', host: '127.0.0.1', port: 7701 },
        { service, id: 'b', host: '127.0.0.1', port: 7702 },
        { service, id: 'v1-a', host: '127.0.0.1', port: 7703, version: 'v1' },
        { service, id: 'down', host: '127.0.0.1', port: 7704, status: 'DOWN' },
      ]);
      await consumer.follow(service);
      assert.deepEqual(
        consumer.cachedInstances(service).map((i) => i.id),
        ['a', 'b', 'down', 'v1-a'],
      );
      const live = await consumer.pick(service);
      assert.equal(live.localFallback, false);
      assert.equal(live.instance.id, 'a');

      await server.kill('SIGKILL');

      const picks = [];
      for (let i = 0; i < 3; i += 1) {
        picks.push(await consumer.pick(service));
      }
      assert.deepEqual(
        picks.map((p) => [p.instance.id, p.ticket, p.localFallback, p.rule]),
        [
          ['a', 0n, true, 'round_robin'],
          ['b', 1n, true, 'round_robin'],
          ['a', 2n, true, 'round_robin'],
        ],
      );
      assert.deepEqual(picks[0]?.instance, plain(service, 'a', 7701));
      const versioned = await consumer.pick(service, { version: 'v1' });
      assert.deepEqual([versioned.instance.id, versioned.fallback, versioned.localFallback], ['v1-a', '', true]);
      const unknownVersion = await withVersion('v9', () => consumer.pick(service));
      assert.deepEqual(
        [unknownVersion.instance.id, unknownVersion.fallback, unknownVersion.localFallback],
        ['b', 'no instance with version "v9"; picked from instances with no version', true],
      );
      // One line for the outage, none per pick.
      const fallbackLines = logger.lines.filter((line) => line.includes('picking locally'));
      assert.equal(fallbackLines.length, 1, logger.lines.join('\n'));
      assert.match(fallbackLines[0] ?? '', /^rota: unreachable \((UNAVAILABLE|DEADLINE_EXCEEDED): .*\); picking locally .*first: it-fallback\/a at 127\.0\.0\.1:7701/);

      await assert.rejects(
        consumer.pick('it-not-followed'),
        expectRotaError(status.UNAVAILABLE, (error) => assert.equal(error.unreachable, true)),
      );
    } finally {
      await consumer.close();
      await provider.close();
      await server.kill();
    }
  });

  it('answers from the watched list while a restarted rota warms up, and keeps that list', { timeout: 90_000 }, async () => {
    const service = 'it-warmup';
    const first = await RotaServer.start();
    let second: RotaServer | undefined;
    const consumer = new RotaClient(first.target, { logger: silentLogger });
    const provider = new RotaClient(first.target, { logger: silentLogger, registration: { closeTimeoutMs: 100 } });
    try {
      await provider.register([
        { service, id: 'a', host: '127.0.0.1', port: 7951 },
        { service, id: 'b', host: '127.0.0.1', port: 7952 },
      ]);
      await consumer.follow(service);
      assert.equal((await consumer.pick(service)).localFallback, false);

      await first.kill('SIGKILL');
      await provider.close();
      second = await RotaServer.start({ listen: first.target, args: ['--warmup', '60s'] });
      // Wait for rota's own warming_up answer (not a refused connection).
      await waitFor(
        async () => {
          try {
            await consumer.listInstances(service);
            return false;
          } catch (error) {
            return error instanceof RotaError && error.reason === 'warming_up';
          }
        },
        { timeoutMs: 30_000, what: "rota's warming_up answer" },
      );
      const local = await consumer.pick(service);
      assert.deepEqual([local.instance.id, local.ticket, local.localFallback], ['a', 0n, true]);
      assert.deepEqual(
        consumer.cachedInstances(service).map((i) => i.id),
        ['a', 'b'],
      );

      // Once a provider registers again, rota answers and the picks are its own.
      const again = new RotaClient(second.target, { logger: silentLogger });
      try {
        await again.register({ service, id: 'b', host: '127.0.0.1', port: 7952 });
        await waitFor(async () => !(await consumer.pick(service)).localFallback, { timeoutMs: 30_000, what: 'a pick answered by rota' });
        assert.equal((await consumer.pick(service)).instance.id, 'b');
      } finally {
        await again.close();
      }
    } finally {
      await consumer.close();
      await provider.close();
      await first.kill();
      await second?.kill();
    }
  });

  for (const signal of ['SIGTERM', 'SIGKILL'] as const) {
    it(`registers again when rota is stopped with ${signal} and restarted on the same port`, { timeout: 60_000 }, async () => {
      const args = ['--shutdown-grace', '500ms'];
      const first = await RotaServer.start({ args });
      let second: RotaServer | undefined;
      // The default reconnection schedule, as an application would have it.
      const logger = new CapturingLogger();
      const rota = new RotaClient(first.target, { logger });
      const service = `it-restart-${signal.toLowerCase()}`;
      try {
        const registration = await rota.register([
          { service, id: 'a', host: '127.0.0.1', port: 7901 },
          { service, id: 'b', host: '127.0.0.1', port: 7902 },
        ]);
        await registration.update({ service, id: 'b' }, { status: 'DRAINING' });
        assert.equal((await rota.pick(service)).instance.id, 'a');

        if (signal === 'SIGTERM') {
          // rota sends Closing on the stream, drains for its grace period and exits by itself.
          await first.stop();
          assert.deepEqual(first.exit, { code: 0, signal: null }, first.log);
        } else {
          await first.kill('SIGKILL');
        }
        second = await RotaServer.start({ listen: first.target, args });
        assert.equal(second.target, first.target);

        // The new server knows only what the registration announces again.
        await waitFor(
          async () => {
            try {
              const { instances } = await rota.listInstances(service);
              return instances.map((i) => i.id).join() === 'a,b';
            } catch {
              return false;
            }
          },
          { timeoutMs: 15_000, intervalMs: 10, what: 'the instances on the new server' },
        );
        assert.deepEqual(
          (await rota.listInstances(service)).instances.map((i) => [i.id, i.status]),
          [
            ['a', 'UP'],
            ['b', 'DRAINING'],
          ],
        );
        const picked = await rota.pick(service);
        assert.deepEqual([picked.instance.id, picked.ticket, picked.localFallback], ['a', 0n, false]);
        assert.ok(logger.lines.some((line) => line.startsWith('rota: registration stream lost')));

        await registration.close();
        assert.deepEqual((await rota.listInstances(service)).instances, []);
        await assert.rejects(
          rota.pick(service),
          expectRotaError(status.UNAVAILABLE, (error) => assert.equal(error.unreachable, false)),
        );
      } finally {
        await rota.close();
        await first.kill();
        await second?.kill();
      }
    });
  }

  it('keeps a registration alive with heartbeats, and re-announces it after rota restarts', async () => {
    const port = await freePort();
    const listen = `127.0.0.1:${port}`;
    let server = await RotaServer.start({ listen, args: ['--heartbeat-timeout', '2s'] });
    const logger = new CapturingLogger();
    const provider = new RotaClient(server.target, { logger, backoff: { initialMs: 50, maxMs: 400 } });
    const observer = new RotaClient(server.target, { logger: silentLogger });
    const service = 'it-reconnect';
    try {
      const registration = await provider.register([
        { service, id: 'r1', host: '127.0.0.1', port: 7801 },
        { service, id: 'r2', host: '127.0.0.1', port: 7802, version: 'v2' },
      ]);
      await registration.update({ service, id: 'r2' }, { status: 'DRAINING' });
      const firstLease = registration.leaseId;
      assert.equal(registration.ack.heartbeatTimeoutMs, 2_000);
      let disconnects = 0;
      registration.on('disconnect', () => {
        disconnects += 1;
      });

      // Three heartbeat timeouts: a silent stream would have been dropped twice over. (A 2 s
      // timeout, heartbeats every 667 ms: a heartbeat may be late by over a second on a loaded
      // machine without the lease expiring.)
      const until = Date.now() + 6_000;
      while (Date.now() < until) {
        const ids = (await observer.listInstances(service)).instances.map((i) => i.id);
        assert.deepEqual(ids, ['r1', 'r2'], 'still registered');
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      assert.equal(disconnects, 0);
      assert.equal(registration.leaseId, firstLease);

      const reconnected = nextEvent<[Ack]>(registration, 'reconnect', 20_000);
      await server.kill('SIGKILL');
      server = await RotaServer.start({ listen, args: ['--heartbeat-timeout', '2s'] });
      const [ack] = await reconnected;
      assert.equal(disconnects, 1);
      assert.deepEqual(ack.accepted, [
        { service, id: 'r1' },
        { service, id: 'r2' },
      ]);
      assert.equal(ack.seq, 1n);
      assert.equal(registration.connected, true);
      assert.deepEqual(
        (await observer.listInstances(service)).instances.map((i) => [i.id, i.status, i.version]),
        [
          ['r1', 'UP', ''],
          ['r2', 'DRAINING', 'v2'],
        ],
      );
      assert.ok(logger.lines.some((line) => line.startsWith('rota: registration stream lost')));

      await registration.close();
      assert.deepEqual((await observer.listInstances(service)).instances, []);
    } finally {
      await provider.close();
      await observer.close();
      await server.kill();
    }
  });
});
