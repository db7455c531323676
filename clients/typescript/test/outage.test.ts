// What the client does while rota is unreachable, warming up or draining, against scripted
// servers: short-cut to the local fallback, one log line per outage, warming_up, bounded
// follow(), and reconnection backoffs that a short-lived stream does not reset.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  Metadata,
  credentials,
  status,
  type sendUnaryData,
  type ServerDuplexStream,
  type ServerUnaryCall,
  type ServerWritableStream,
} from '@grpc/grpc-js';

import { InstanceCache, RotaClient, RotaError } from '../src/index.js';
import { UNREACHABLE_STREAK } from '../src/client.js';
import type { Instance as InstanceMessage } from '../src/generated/rota/v1/Instance.js';
import { rotaV1 } from '../src/proto.js';
import { ServiceWatcher } from '../src/watcher.js';
import { FakeRota } from './fake-rota.js';
import { CapturingLogger, waitFor } from './harness.js';

const cached: InstanceMessage[] = [
  { id: 'a', service: 'svc', host: '127.0.0.1', port: 9001, status: 'UP' },
  { id: 'b', service: 'svc', host: '127.0.0.1', port: 9002, status: 'UP' },
];

const PICKED = { instance: cached[1], ticket: 7, rule: 'round_robin', fallback: '', epoch: 1 };

type PickHandler = (call: ServerUnaryCall<unknown, unknown>, callback: sendUnaryData<unknown>) => void;

function warmingUp(callback: sendUnaryData<unknown>): void {
  const metadata = new Metadata();
  metadata.set('rota-error', 'warming_up');
  callback({ code: status.UNAVAILABLE, details: 'rota is warming up', metadata });
}

/** A rota whose picks run `onPick()` and whose watches stay open (listed in `watches`). */
async function scripted(state: { onPick: PickHandler; picks: number }) {
  const watches: ServerWritableStream<{ service: string }, unknown>[] = [];
  const fake = await FakeRota.start({
    balancer: {
      Pick(call: ServerUnaryCall<unknown, unknown>, callback: sendUnaryData<unknown>) {
        state.picks += 1;
        state.onPick(call, callback);
      },
    },
    registry: {
      Watch(call: ServerWritableStream<{ service: string }, unknown>) {
        watches.push(call);
        call.write({ snapshot: { instances: cached }, epoch: 3 });
      },
    },
  });
  return { fake, watches };
}

describe('outages', () => {
  it('short-cuts to the local fallback after repeated failures, then asks rota again', async () => {
    const state = { picks: 0, onPick: ((_call, callback) => warmingUp(callback)) as PickHandler };
    const { fake } = await scripted(state);
    const logger = new CapturingLogger();
    // A window far longer than the test: picks inside it must not reach rota at all.
    const long = new RotaClient(fake.target, { logger, shortCutMs: 300_000, pickTimeoutMs: 30_000 });
    const short = new RotaClient(fake.target, { logger, shortCutMs: 50, pickTimeoutMs: 30_000 });
    try {
      await long.follow('svc');
      for (let i = 0; i < UNREACHABLE_STREAK; i += 1) {
        assert.equal((await long.pick('svc')).localFallback, true);
      }
      assert.equal(state.picks, UNREACHABLE_STREAK);
      const inWindow = [];
      for (let i = 0; i < 10; i += 1) {
        inWindow.push(await long.pick('svc'));
      }
      assert.deepEqual(
        inWindow.map((p) => p.localFallback),
        inWindow.map(() => true),
      );
      assert.equal(state.picks, UNREACHABLE_STREAK, 'picks that reached rota');

      state.picks = 0;
      await short.follow('svc');
      for (let i = 0; i < UNREACHABLE_STREAK; i += 1) {
        await short.pick('svc');
      }
      state.onPick = (_call, callback) => callback(null, PICKED);
      // Past the window rota is asked again, and its answer ends the short-cut.
      let answered = false;
      await waitFor(
        async () => {
          answered = !(await short.pick('svc')).localFallback;
          return answered;
        },
        { what: 'a pick answered by rota', timeoutMs: 20_000 },
      );
      assert.equal(state.picks, UNREACHABLE_STREAK + 1);
      assert.equal((await short.pick('svc')).localFallback, false);
    } finally {
      await Promise.all([long.close(), short.close()]);
      fake.stop();
    }
  });

  it('logs once per outage and once on recovery, and counts tickets 0, 1, 2', async () => {
    const state = { picks: 0, onPick: ((_call, callback) => warmingUp(callback)) as PickHandler };
    const { fake } = await scripted(state);
    const logger = new CapturingLogger();
    const client = new RotaClient(fake.target, { logger, shortCutMs: 1 });
    try {
      await client.follow('svc');
      for (let outage = 0; outage < 2; outage += 1) {
        state.onPick = (_call, callback) => warmingUp(callback);
        const picks = [];
        for (let i = 0; i < 20; i += 1) {
          picks.push(await client.pick('svc'));
        }
        assert.ok(picks.every((p) => p.localFallback && p.fallback === '' && p.rule === 'round_robin'));
        if (outage === 0) {
          assert.deepEqual(
            picks.slice(0, 3).map((p) => p.ticket),
            [0n, 1n, 2n],
          );
        }
        state.onPick = (_call, callback) => callback(null, PICKED);
        await waitFor(async () => !(await client.pick('svc')).localFallback, { what: "rota's answer", timeoutMs: 20_000 });
        await client.pick('svc');
      }
      assert.equal(logger.lines.length, 4, logger.lines.join('\n'));
      for (const i of [0, 2]) {
        assert.match(logger.lines[i] ?? '', /^rota: unreachable \(UNAVAILABLE: rota is warming up\).*first: svc\/[ab] at 127\.0\.0\.1:900[12]/);
        assert.match(logger.lines[i + 1] ?? '', /^rota: reachable again/);
      }
    } finally {
      await client.close();
      fake.stop();
    }
  });

  it("falls back on warming_up, which is rota's answer and not unreachable", async () => {
    const state = { picks: 0, onPick: ((_call, callback) => warmingUp(callback)) as PickHandler };
    const { fake } = await scripted(state);
    const client = new RotaClient(fake.target, { logger: new CapturingLogger() });
    try {
      await client.follow('svc');
      const pick = await client.pick('svc');
      assert.deepEqual([pick.instance.id, pick.ticket, pick.localFallback], ['a', 0n, true]);
    } finally {
      await client.close();
      fake.stop();
    }
  });

  it('keeps the list against an empty snapshot at epoch 0, not at a later epoch', async () => {
    const state = { picks: 0, onPick: ((_call, callback) => callback(null, PICKED)) as PickHandler };
    const { fake, watches } = await scripted(state);
    const client = new RotaClient(fake.target, { logger: new CapturingLogger() });
    try {
      await client.follow('svc');
      const added = { id: 'n', service: 'svc', host: '127.0.0.1', port: 9005, status: 'UP' };
      const push = (event: unknown) => watches.forEach((watch) => watch.write(event));
      // An empty snapshot at epoch 0 (a restarted rota), then an added instance to know the
      // snapshot was handled.
      push({ snapshot: { instances: [] }, epoch: 0 });
      push({ added, epoch: 1 });
      await waitFor(() => client.cachedInstances('svc').length === 3, { what: 'the added instance' });
      assert.deepEqual(
        client.cachedInstances('svc').map((i) => i.id),
        ['a', 'b', 'n'],
      );
      // An empty snapshot at a later epoch is rota's word.
      push({ snapshot: { instances: [] }, epoch: 7 });
      push({ added, epoch: 8 });
      await waitFor(() => client.cachedInstances('svc').map((i) => i.id).join() === 'n', { what: 'the list to be [n]' });
    } finally {
      await client.close();
      fake.stop();
    }
  });

  it('settles follow() within its timeout while rota is down', async () => {
    const gone = await FakeRota.start({});
    gone.stop();
    const client = new RotaClient(gone.target, { logger: new CapturingLogger() });
    try {
      await assert.rejects(client.follow('svc', { timeoutMs: 300 }), (error: unknown) => {
        assert.ok(error instanceof RotaError);
        assert.equal(error.code, status.UNAVAILABLE);
        assert.equal(error.unreachable, true);
        return true;
      });
      // A service never seen raises the unreachable error.
      await assert.rejects(client.pick('svc'), (error: unknown) => error instanceof RotaError && error.unreachable);
    } finally {
      await client.close();
    }
  });

  it('does not reset the watch backoff on a snapshot of a stream that ends at once', async () => {
    let watches = 0;
    const fake = await FakeRota.start({
      registry: {
        Watch(call: ServerWritableStream<{ service: string }, unknown>) {
          watches += 1;
          call.write({ snapshot: { instances: cached }, epoch: 3 });
          call.end();
        },
      },
    });
    const registry = new (rotaV1().Registry)(fake.target, credentials.createInsecure());
    const cache = new InstanceCache();
    const watcher = new ServiceWatcher('svc', registry, cache, new CapturingLogger(), { initialMs: 1, maxMs: 5 });
    try {
      watcher.start();
      // Reset on each snapshot, the attempt count would go 1, 0, 1, 0, ...
      await waitFor(() => watcher.attempt >= 5, { what: 'five attempts in a row', timeoutMs: 20_000 });
      assert.ok(watches >= 5);
      assert.deepEqual(
        cache.instances('svc').map((i) => i.id),
        ['a', 'b'],
      );
    } finally {
      watcher.close();
      registry.close();
      fake.stop();
    }
  });

  it('does not count an announcement a draining rota refused as a reconnection', async () => {
    let streams = 0;
    const fake = await FakeRota.start({
      registry: {
        Register(call: ServerDuplexStream<{ announce?: { instances: InstanceMessage[] } }, unknown>) {
          streams += 1;
          const first = streams === 1;
          let seq = 0;
          call.on('data', (message: { announce?: { instances: InstanceMessage[] } }) => {
            if (message.announce === undefined || message.announce === null) {
              return;
            }
            seq += 1;
            const refs = message.announce.instances.map((i) => ({ service: i.service, id: i.id }));
            if (first) {
              call.write({ ack: { leaseId: 1, seq, accepted: refs, refused: [], heartbeatTimeoutMs: 60_000 } });
              // Then the stream is lost, once the client holds the instance.
              setTimeout(() => call.end(), 50);
            } else {
              const refused = refs.map((instance) => ({ instance, code: status.UNAVAILABLE, message: 'rota is shutting down' }));
              call.write({ ack: { leaseId: streams, seq, accepted: [], refused, heartbeatTimeoutMs: 60_000 } });
              call.write({ closing: { reason: 'rota is shutting down' } });
              call.end();
            }
          });
          call.on('end', () => call.end());
        },
      },
    });
    const logger = new CapturingLogger();
    const client = new RotaClient(fake.target, { logger, backoff: { initialMs: 1, maxMs: 5 } });
    try {
      const registration = await client.register({ service: 'svc', id: 'a', host: '127.0.0.1', port: 9001 });
      await waitFor(() => streams >= 5, { what: 'four reconnection attempts', timeoutMs: 20_000 });
      assert.equal(registration.connected, false);
      assert.deepEqual(
        logger.lines.filter((line) => line.includes('reconnected')),
        [],
      );
      assert.equal(logger.lines.filter((line) => line.includes('stream lost')).length, 1, logger.lines.join('\n'));
      assert.equal(logger.lines.filter((line) => line.includes('reconnecting the registration failed')).length, 1, logger.lines.join('\n'));
    } finally {
      await client.close();
      fake.stop();
    }
  });
});
