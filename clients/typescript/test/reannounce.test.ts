// A registration's re-announcement after a lost stream, against a scripted Register: an
// instance that rota refuses for now (ALREADY_EXISTS) is retried but not listed as held, each
// new stream announces every instance once, and withdrawing a retried instance gives it up.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { status, type ServerDuplexStream } from '@grpc/grpc-js';

import { RotaClient, type InstanceRef } from '../src/index.js';
import type { Instance as InstanceMessage } from '../src/generated/rota/v1/Instance.js';
import { FakeRota } from './fake-rota.js';
import { CapturingLogger, waitFor } from './harness.js';

interface RequestMessage {
  announce?: { instances: InstanceMessage[] } | null;
  withdraw?: { instances: InstanceRef[] } | null;
}

interface Refusal {
  instance: InstanceRef;
  code: status;
  message: string;
}

/** One Register stream as the fake sees it: what was announced on it, and a way to end it. */
interface FakeStream {
  announced: string[][];
  end: () => void;
}

/**
 * A Register whose streams answer announcements with `refuse` (the refusals for the given ids
 * on the given stream, by index), and withdrawals of instances it does not hold with NOT_FOUND.
 */
async function scriptedRota(refuse: (stream: number, ids: string[]) => Set<string>): Promise<{ fake: FakeRota; streams: FakeStream[] }> {
  const streams: FakeStream[] = [];
  const fake = await FakeRota.start({
    registry: {
      Register(call: ServerDuplexStream<RequestMessage, unknown>) {
        const index = streams.length;
        let ended = false;
        const stream: FakeStream = {
          announced: [],
          end: () => {
            ended = true;
            call.end();
          },
        };
        streams.push(stream);
        const held = new Set<string>();
        let seq = 0;
        call.on('data', (message: RequestMessage) => {
          let accepted: InstanceRef[];
          let refused: Refusal[];
          if (message.announce !== undefined && message.announce !== null) {
            const ids = message.announce.instances.map((i) => i.id ?? '');
            stream.announced.push(ids);
            const refusing = refuse(index, ids);
            accepted = ids.filter((id) => !refusing.has(id)).map((id) => ({ service: 'svc', id }));
            refused = ids
              .filter((id) => refusing.has(id))
              .map((id) => ({ instance: { service: 'svc', id }, code: status.ALREADY_EXISTS, message: 'held by another lease' }));
            accepted.forEach((ref) => held.add(ref.id));
          } else if (message.withdraw !== undefined && message.withdraw !== null) {
            const ids = message.withdraw.instances.length > 0 ? message.withdraw.instances.map((r) => r.id) : [...held];
            accepted = ids.filter((id) => held.has(id)).map((id) => ({ service: 'svc', id }));
            refused = ids
              .filter((id) => !held.has(id))
              .map((id) => ({ instance: { service: 'svc', id }, code: status.NOT_FOUND, message: 'not on this lease' }));
            ids.forEach((id) => held.delete(id));
          } else {
            return;
          }
          if (ended) {
            return;
          }
          seq += 1;
          call.write({ ack: { leaseId: index + 1, seq, accepted, refused, heartbeatTimeoutMs: 60_000 } });
        });
        call.on('error', () => {});
        call.on('end', () => stream.end());
      },
    },
  });
  return { fake, streams };
}

const A = { service: 'svc', id: 'a', host: '127.0.0.1', port: 9001 };
const B = { service: 'svc', id: 'b', host: '127.0.0.1', port: 9002 };

describe('re-announcement', () => {
  it('lists an instance refused for now only once rota accepts it, and announces it once per stream', async () => {
    // The second stream is refused "b"; the third is not.
    const { fake, streams } = await scriptedRota((stream, ids) => new Set(stream === 1 ? ids.filter((id) => id === 'b') : []));
    const client = new RotaClient(fake.target, { logger: new CapturingLogger(), backoff: { initialMs: 1, maxMs: 5 } });
    try {
      const registration = await client.register([A, B]);
      const reconnected = new Promise<void>((resolve) => registration.once('reconnect', () => resolve()));
      streams[0]!.end();
      await reconnected;
      assert.deepEqual(streams[1]!.announced[0], ['a', 'b']);
      assert.deepEqual(
        registration.instances.map((ref) => ref.id),
        ['a'],
        'only what rota acknowledged',
      );
      await waitFor(() => streams[1]!.announced.length >= 2, { what: 'a retry of "b"' });
      assert.deepEqual(streams[1]!.announced[1], ['b']);
      assert.deepEqual(registration.instances.map((ref) => ref.id), ['a']);

      // Lost again while "b" is refused: the next stream announces each instance once.
      const again = new Promise<void>((resolve) => registration.once('reconnect', () => resolve()));
      streams[1]!.end();
      await again;
      assert.deepEqual(streams[2]!.announced[0], ['a', 'b']);
      assert.deepEqual(registration.instances.map((ref) => ref.id).sort(), ['a', 'b']);
    } finally {
      await client.close();
      fake.stop();
    }
  });

  it('gives up an instance refused for now once it is withdrawn', async () => {
    const { fake, streams } = await scriptedRota((stream, ids) => new Set(stream === 1 ? ids.filter((id) => id === 'b') : []));
    const client = new RotaClient(fake.target, { logger: new CapturingLogger(), backoff: { initialMs: 1, maxMs: 5 } });
    try {
      const registration = await client.register([A, B]);
      const reconnected = new Promise<void>((resolve) => registration.once('reconnect', () => resolve()));
      streams[0]!.end();
      await reconnected;
      const ack = await registration.withdraw([{ service: 'svc', id: 'b' }]);
      assert.deepEqual(ack.refused.map((r) => [r.instance.id, r.code]), [['b', status.NOT_FOUND]]);
      const again = new Promise<void>((resolve) => registration.once('reconnect', () => resolve()));
      streams[1]!.end();
      await again;
      assert.deepEqual(streams[2]!.announced, [['a']], 'the withdrawn instance is not announced again');
      assert.deepEqual(registration.instances.map((ref) => ref.id), ['a']);
    } finally {
      await client.close();
      fake.stop();
    }
  });
});
