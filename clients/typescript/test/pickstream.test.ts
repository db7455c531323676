// Many PickRequests pipelined on one PickStream (sent without waiting for the answers, read
// as they come) on a connection that also carries an open Register stream.

import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, describe, it } from 'node:test';

import { Channel, credentials, type ClientDuplexStream } from '@grpc/grpc-js';

import type { PickRequest } from '../src/generated/rota/v1/PickRequest.js';
import type { PickResponse__Output } from '../src/generated/rota/v1/PickResponse.js';
import type { RegisterRequest } from '../src/generated/rota/v1/RegisterRequest.js';
import type { RegisterResponse__Output } from '../src/generated/rota/v1/RegisterResponse.js';
import { rotaV1 } from '../src/proto.js';
import { RotaServer } from './harness.js';

const N = 20_000;
const IDS = ['a', 'b', 'c'];

/** Reads a Register stream's responses one at a time. */
class Responses {
  readonly #queue: RegisterResponse__Output[] = [];
  readonly #waiting: ((response: RegisterResponse__Output | Error) => void)[] = [];
  #failure: Error | undefined;

  constructor(stream: ClientDuplexStream<RegisterRequest, RegisterResponse__Output>) {
    stream.on('data', (response: RegisterResponse__Output) => {
      const waiter = this.#waiting.shift();
      if (waiter !== undefined) {
        waiter(response);
      } else {
        this.#queue.push(response);
      }
    });
    stream.on('error', (error: Error) => {
      this.#failure = error;
      for (const waiter of this.#waiting.splice(0)) {
        waiter(error);
      }
    });
  }

  next(timeoutMs: number): Promise<RegisterResponse__Output> {
    const queued = this.#queue.shift();
    if (queued !== undefined) {
      return Promise.resolve(queued);
    }
    if (this.#failure !== undefined) {
      return Promise.reject(this.#failure);
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no Register response within ${timeoutMs} ms`)), timeoutMs);
      this.#waiting.push((response) => {
        clearTimeout(timer);
        if (response instanceof Error) {
          reject(response);
        } else {
          resolve(response);
        }
      });
    });
  }
}

describe('PickStream', () => {
  let server: RotaServer;

  before(async () => {
    // The Register stream sends no heartbeat during the burst: a heartbeat timeout far longer
    // than the test keeps its lease from expiring on a slow machine (20,000 picks can take
    // longer than the default 15 s there).
    server = await RotaServer.start({ args: ['--heartbeat-timeout', '120s'] });
  });

  after(async () => {
    await server?.stop();
  });

  it(`answers ${N} pipelined requests in order, and the connection survives`, { timeout: 60_000 }, async () => {
    const rota = rotaV1();
    const insecure = credentials.createInsecure();
    // One channel, so the Register stream and the PickStream share one HTTP/2 connection.
    const channel = new Channel(server.target, insecure, {});
    const registry = new rota.Registry(server.target, insecure, { channelOverride: channel });
    const balancer = new rota.Balancer(server.target, insecure, { channelOverride: channel });
    const service = 'ts-pipeline';
    const register = registry.Register();
    const picks = balancer.PickStream();
    try {
      const acks = new Responses(register);
      register.write({
        announce: { instances: IDS.map((id, i) => ({ service, id, host: '127.0.0.1', port: 9001 + i })) },
      });
      const announced = await acks.next(10_000);
      assert.equal(announced.msg, 'ack');
      assert.deepEqual(
        announced.ack?.accepted.map((ref) => ref.id),
        IDS,
      );
      const lease = announced.ack?.leaseId;

      // The reader: every response, in order, until the stream ends or fails.
      const responses: PickResponse__Output[] = [];
      const start = Date.now();
      const read = new Promise<void>((resolve, reject) => {
        picks.on('data', (response: PickResponse__Output) => responses.push(response));
        picks.on('end', () => resolve());
        picks.on('error', (error: Error) =>
          reject(
            new Error(
              `after ${responses.length} of ${N} responses (${Date.now() - start} ms): ${error.message}\nserver log (tail):\n${server.log.slice(-4_000)}`,
            ),
          ),
        );
      });
      // The writer: as fast as the stream takes them, waiting only when its buffer is full.
      const request: PickRequest = { service, rule: 'round_robin' };
      let failed = false;
      picks.once('error', () => {
        failed = true;
      });
      for (let i = 0; i < N && !failed; i += 1) {
        if (!picks.write(request)) {
          await Promise.race([once(picks, 'drain'), read.catch(() => undefined)]);
        }
      }
      picks.end();
      await read;

      assert.equal(responses.length, N);
      const counts = new Map<string, number>();
      responses.forEach((response, i) => {
        assert.equal(response.error, null, `response ${i} carries an error: ${JSON.stringify(response.error)}`);
        // Raw messages, decoded with the client's loader options: 64-bit integers as decimal strings.
        assert.equal(response.ticket, String(i), `ticket of response ${i}`);
        const id = response.instance?.id ?? '';
        assert.equal(id, IDS[i % IDS.length], `instance of ticket ${i} by round robin`);
        counts.set(id, (counts.get(id) ?? 0) + 1);
      });
      for (const id of IDS) {
        const count = counts.get(id) ?? 0;
        assert.ok(Math.abs(count - N / IDS.length) <= 1, `${id} picked ${count} times, want ${N / IDS.length} ± 1`);
      }

      // The Register stream lived through the burst: an update is acknowledged on the same lease.
      register.write({ update: { instance: { service, id: 'c' }, status: 'DRAINING' } });
      const updated = await acks.next(10_000);
      assert.equal(updated.msg, 'ack');
      assert.equal(updated.ack?.seq, '2');
      assert.equal(updated.ack?.leaseId, lease);
      assert.deepEqual(
        updated.ack?.accepted.map((ref) => ref.id),
        ['c'],
      );
    } finally {
      picks.cancel();
      register.end();
      register.cancel();
      channel.close();
    }
  });
});
