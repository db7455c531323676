import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Metadata, status, type sendUnaryData, type ServerUnaryCall, type ServerWritableStream } from '@grpc/grpc-js';

import { asRotaError, fallsBack } from '../src/errors.js';
import { InstanceCache, RotaClient, RotaError, classifyError, isUnreachable, type Instance } from '../src/index.js';
import type { Instance as InstanceMessage } from '../src/generated/rota/v1/Instance.js';
import { FakeRota } from './fake-rota.js';
import { CapturingLogger, waitFor } from './harness.js';

function instance(id: string, fields: Partial<Instance> = {}): Instance {
  return {
    id,
    service: 'svc',
    host: '127.0.0.1',
    port: 9000,
    version: '',
    zone: '',
    weight: 100,
    metadata: {},
    status: 'UP',
    ...fields,
  };
}

function ids(cache: InstanceCache, count: number, options: { version?: string; exclude?: string[] } = {}): string[] {
  return Array.from({ length: count }, () => cache.pick('svc', options)?.instance.id ?? '<none>');
}

describe('InstanceCache (local fallback)', () => {
  it('rotates round robin over the UP instances in id order', () => {
    const cache = new InstanceCache();
    cache.replace(
      'svc',
      [instance('c'), instance('a'), instance('drain', { status: 'DRAINING' }), instance('b'), instance('down', { status: 'DOWN' })],
      7n,
    );
    const picks = Array.from({ length: 5 }, () => cache.pick('svc'));
    assert.deepEqual(
      picks.map((p) => p?.instance.id),
      ['a', 'b', 'c', 'a', 'b'],
    );
    assert.deepEqual(
      picks.map((p) => p?.ticket),
      [0n, 1n, 2n, 3n, 4n],
    );
    assert.deepEqual(
      picks.map((p) => p?.fallback),
      ['', '', '', '', ''],
    );
    assert.equal(picks[0]?.epoch, 7n);
  });

  it('isolates versions the way rota does', () => {
    const cache = new InstanceCache();
    cache.replace(
      'svc',
      [
        instance('plain-1'),
        instance('plain-2'),
        instance('v1-a', { version: 'v1' }),
        instance('v1-b', { version: 'v1' }),
        instance('v2-a', { version: 'v2' }),
        instance('v3-down', { version: 'v3', status: 'DOWN' }),
      ],
      1n,
    );
    // No version: only the unversioned instances, never a versioned one.
    assert.deepEqual(ids(cache, 3), ['plain-1', 'plain-2', 'plain-1']);
    // Version V: the instances of V only.
    assert.deepEqual(ids(cache, 3, { version: 'v1' }), ['v1-a', 'v1-b', 'v1-a']);
    assert.deepEqual(ids(cache, 2, { version: 'v2' }), ['v2-a', 'v2-a']);
    // A version with no UP instance falls back to the unversioned ones (sharing their rotation).
    const fallback = cache.pick('svc', { version: 'v3' });
    assert.equal(fallback?.instance.id, 'plain-2');
    assert.equal(fallback?.fallback, 'no instance with version "v3"; picked from instances with no version');
    assert.equal(cache.pick('svc', { version: 'nobody' })?.instance.id, 'plain-1');
  });

  it('answers nothing when no instance is eligible', () => {
    const cache = new InstanceCache();
    assert.equal(cache.pick('svc'), undefined, 'service not cached');
    cache.replace('svc', [instance('v1-a', { version: 'v1' }), instance('down', { status: 'DOWN' })], 1n);
    assert.equal(cache.pick('svc'), undefined, 'no unversioned UP instance');
    assert.equal(cache.pick('svc', { version: 'v9' }), undefined, 'no instance of v9 and none unversioned');
    assert.equal(cache.pick('svc', { version: 'v1', exclude: ['v1-a'] }), undefined, 'all excluded');
  });

  it('rotates over the instances not excluded', () => {
    const cache = new InstanceCache();
    cache.replace('svc', [instance('a'), instance('b'), instance('c')], 1n);
    // As rota's round robin: ticket t takes position t mod 2 of [a, c] (skipping forward from
    // position t mod 3 of [a, b, c] would give a, c, c).
    assert.deepEqual(ids(cache, 6, { exclude: ['b'] }), ['a', 'c', 'a', 'c', 'a', 'c']);
    // Tickets 6, 7, 8 over [a, b].
    assert.deepEqual(ids(cache, 3, { exclude: ['c'] }), ['a', 'b', 'a']);
  });

  it('excludes inside the version subset, never falling through to unversioned instances', () => {
    const cache = new InstanceCache();
    cache.replace('svc', [instance('plain-1'), instance('plain-2'), instance('v1-a', { version: 'v1' }), instance('v1-b', { version: 'v1' })], 1n);
    assert.deepEqual(ids(cache, 2, { version: 'v1', exclude: ['v1-a'] }), ['v1-b', 'v1-b']);
    assert.equal(cache.pick('svc', { version: 'v1', exclude: ['v1-a', 'v1-b'] }), undefined, 'the v1 subset is all excluded');
    // No ticket was drawn for the failed pick: the v1 rotation goes on at 2.
    assert.equal(cache.pick('svc', { version: 'v1' })?.ticket, 2n);
    // A version fallback is excluded inside the unversioned subset.
    const fallback = cache.pick('svc', { version: 'v9', exclude: ['plain-1'] });
    assert.equal(fallback?.instance.id, 'plain-2');
    assert.equal(fallback?.fallback, 'no instance with version "v9"; picked from instances with no version');
    assert.equal(cache.pick('svc', { version: 'v9', exclude: ['plain-1', 'plain-2'] }), undefined);
  });

  it('follows watch events', () => {
    const cache = new InstanceCache();
    cache.replace('svc', [instance('a'), instance('b')], 1n);
    cache.upsert(instance('c'), 2n);
    cache.upsert(instance('a', { status: 'DOWN' }), 3n);
    cache.remove({ service: 'svc', id: 'b' }, 4n);
    assert.deepEqual(
      cache.instances('svc').map((i) => `${i.id}:${i.status}`),
      ['a:DOWN', 'c:UP'],
    );
    assert.equal(cache.epoch('svc'), 4n);
    assert.deepEqual(ids(cache, 2), ['c', 'c']);
    cache.delete('svc');
    assert.equal(cache.has('svc'), false);
    assert.deepEqual(cache.instances('svc'), []);
  });
});

describe('failure classification', () => {
  const withHeaders = new Metadata();
  withHeaders.set('content-type', 'application/grpc');

  // The definition every client shares: clients/conformance/README.md, "Unreachable".
  it('tells an unreachable rota from an answer of rota', () => {
    const reason = (value: string, base: Metadata = new Metadata()) => {
      const metadata = base.clone();
      metadata.set('rota-error', value);
      return metadata;
    };
    // UNAVAILABLE or DEADLINE_EXCEEDED without rota's reason, whoever made it up: the transport,
    // or a proxy with no rota behind it (which answers with headers of its own).
    assert.equal(isUnreachable({ code: status.UNAVAILABLE, metadata: new Metadata() }), true);
    assert.equal(isUnreachable({ code: status.DEADLINE_EXCEEDED, metadata: new Metadata() }), true);
    assert.equal(isUnreachable({ code: status.UNAVAILABLE, metadata: withHeaders }), true);
    assert.equal(isUnreachable({ code: status.DEADLINE_EXCEEDED, metadata: withHeaders }), true);
    // rota's own answers carry their reason: not unreachable, warming_up included.
    assert.equal(isUnreachable({ code: status.UNAVAILABLE, metadata: reason('no_eligible_instance', withHeaders) }), false);
    assert.equal(isUnreachable({ code: status.UNAVAILABLE, metadata: reason('warming_up', withHeaders) }), false);
    assert.equal(isUnreachable({ code: status.NOT_FOUND, metadata: reason('unknown_service', withHeaders) }), false);
    // Other codes are answers, or the caller giving up.
    assert.equal(isUnreachable({ code: status.NOT_FOUND, metadata: new Metadata() }), false);
    assert.equal(isUnreachable({ code: status.INVALID_ARGUMENT, metadata: withHeaders }), false);
    assert.equal(isUnreachable({ code: status.INTERNAL, metadata: new Metadata() }), false);
    assert.equal(isUnreachable({ code: status.CANCELLED, metadata: new Metadata() }), false);

    // Warming up is not unreachable, but a pick falls back on it all the same.
    const warming = new RotaError(status.UNAVAILABLE, 'rota is warming up', { metadata: reason('warming_up') });
    assert.equal(warming.unreachable, false);
    assert.equal(fallsBack(warming), true);
    const gone = asRotaError(Object.assign(new Error('14 UNAVAILABLE'), { code: 14, details: 'No connection established', metadata: new Metadata() }));
    assert.equal(gone.unreachable, true);
    assert.equal(fallsBack(gone), true);
    const noneEligible = new RotaError(status.UNAVAILABLE, 'no UP instance', { metadata: reason('no_eligible_instance') });
    assert.equal(fallsBack(noneEligible), false);
  });

  it('classifies failed calls for reports', () => {
    const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' });
    assert.equal(classifyError(refused), 'CONNECT_FAILURE');
    assert.equal(classifyError(new TypeError('fetch failed', { cause: refused })), 'CONNECT_FAILURE');
    assert.equal(classifyError(new Error('HTTP 500')), 'ERROR');
    assert.equal(classifyError('a string'), 'ERROR');
    const grpcUnreachable = Object.assign(new Error('14 UNAVAILABLE'), { code: 14, details: '', metadata: new Metadata() });
    assert.equal(classifyError(grpcUnreachable), 'CONNECT_FAILURE');
    const grpcAnswer = Object.assign(new Error('5 NOT_FOUND'), { code: 5, details: '', metadata: withHeaders });
    assert.equal(classifyError(grpcAnswer), 'ERROR');
  });
});

describe('RotaClient local fallback (scripted server)', () => {
  const cached: InstanceMessage[] = [
    { id: 'a', service: 'svc', host: '127.0.0.1', port: 9001, status: 'UP' },
    { id: 'b', service: 'svc', host: '127.0.0.1', port: 9002, status: 'UP' },
    { id: 'v1-a', service: 'svc', host: '127.0.0.1', port: 9101, version: 'v1', status: 'UP' },
  ];

  async function scripted(pick: (call: ServerUnaryCall<unknown, unknown>, callback: sendUnaryData<unknown>) => void) {
    return FakeRota.start({
      balancer: { Pick: pick },
      registry: {
        Watch(call: ServerWritableStream<{ service: string }, unknown>) {
          call.write({ snapshot: { instances: call.request.service === 'svc' ? cached : [] }, epoch: 3 });
        },
      },
    });
  }

  it('is used on transport failure only, never on an answer of rota', async () => {
    const fake = await scripted((_call, callback) => {
      // What rota sends when nothing is eligible: UNAVAILABLE with its reason.
      const metadata = new Metadata();
      metadata.set('rota-error', 'no_eligible_instance');
      callback({ code: status.UNAVAILABLE, details: 'no UP instance', metadata });
    });
    const logger = new CapturingLogger();
    const client = new RotaClient(fake.target, { logger, pickTimeoutMs: 1_000 });
    try {
      await client.follow('svc');
      assert.deepEqual(
        client.cachedInstances('svc').map((i) => i.id),
        ['a', 'b', 'v1-a'],
      );

      // rota answered UNAVAILABLE: the error stands even though the cache could serve.
      await assert.rejects(client.pick('svc'), (error: unknown) => {
        assert.ok(error instanceof RotaError);
        assert.equal(error.code, status.UNAVAILABLE);
        assert.equal(error.details, 'no UP instance');
        assert.equal(error.unreachable, false);
        return true;
      });
      assert.equal(logger.lines.length, 0);

      // rota is gone: picks come from the cache, flagged and logged.
      fake.stop();
      const first = await client.pick('svc');
      assert.equal(first.localFallback, true);
      assert.deepEqual(first.instance, {
        id: 'a',
        service: 'svc',
        host: '127.0.0.1',
        port: 9001,
        version: '',
        zone: '',
        weight: 100,
        metadata: {},
        status: 'UP',
      });
      assert.equal(first.ticket, 0n);
      assert.equal(first.rule, 'round_robin');
      assert.equal(first.fallback, '');
      assert.equal(first.epoch, 3n);
      assert.equal((await client.pick('svc')).instance.id, 'b');
      assert.equal((await client.pick('svc', { version: 'v1' })).instance.id, 'v1-a');
      assert.equal((await client.pick('svc')).instance.id, 'a');
      // One line for the outage, none per pick.
      assert.equal(logger.lines.length, 1, logger.lines.join('\n'));
      assert.match(logger.lines[0] ?? '', /unreachable .*UNAVAILABLE.*first: svc\/a at 127\.0\.0\.1:9001/);

      // Exclusion after version isolation: the v1 subset all excluded fails like rota.
      await assert.rejects(client.pick('svc', { version: 'v1', exclude: ['v1-a'] }), (error: unknown) => {
        assert.ok(error instanceof RotaError);
        assert.equal(error.code, status.UNAVAILABLE);
        assert.equal(error.reason, 'no_eligible_instance');
        assert.equal(error.unreachable, false);
        return true;
      });

      // A service that is not followed has no fallback: the transport error surfaces.
      await assert.rejects(client.pick('other'), (error: unknown) => {
        assert.ok(error instanceof RotaError);
        assert.equal(error.code, status.UNAVAILABLE);
        assert.equal(error.unreachable, true);
        return true;
      });
    } finally {
      await client.close();
      fake.stop();
    }
  });

  it('is used when a pick misses its deadline', async () => {
    const fake = await scripted(() => {
      // Never answers.
    });
    const logger = new CapturingLogger();
    const client = new RotaClient(fake.target, { logger, pickTimeoutMs: 300 });
    try {
      await client.follow('svc');
      const started = Date.now();
      const result = await client.pick('svc', { version: 'v1' });
      assert.equal(result.localFallback, true);
      assert.equal(result.instance.id, 'v1-a');
      assert.ok(Date.now() - started >= 250, 'waited for the deadline');
      assert.equal(result.fallback, '');
      assert.equal(logger.lines.length, 1);
      assert.match(logger.lines[0] ?? '', /DEADLINE_EXCEEDED/);
    } finally {
      await client.close();
      fake.stop();
    }
  });

  it('keeps the cached list while the watch is down and replaces it on the next snapshot', async () => {
    let snapshot: InstanceMessage[] = cached;
    const registry = {
      Watch(call: ServerWritableStream<{ service: string }, unknown>) {
        call.write({ snapshot: { instances: snapshot }, epoch: 3 });
      },
    };
    const fake = await FakeRota.start({ registry });
    const logger = new CapturingLogger();
    const client = new RotaClient(fake.target, { logger, backoff: { initialMs: 20, maxMs: 100 } });
    let second: FakeRota | undefined;
    try {
      await client.follow('svc');
      fake.stop();
      assert.equal((await client.pick('svc')).localFallback, true, 'rota is gone');
      assert.deepEqual(
        client.cachedInstances('svc').map((i) => i.id),
        ['a', 'b', 'v1-a'],
      );
      snapshot = [{ id: 'z', service: 'svc', host: '127.0.0.1', port: 9009, status: 'UP' }];
      second = await FakeRota.start({ registry }, fake.port);
      await waitFor(() => client.cachedInstances('svc').length === 1, { what: 'the new snapshot', timeoutMs: 5_000 });
      assert.deepEqual(
        client.cachedInstances('svc').map((i) => i.id),
        ['z'],
      );
    } finally {
      await client.close();
      fake.stop();
      second?.stop();
    }
  });
});
