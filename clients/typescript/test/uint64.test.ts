// 64-bit integers of the wire (tickets, epochs, lease ids, sequence numbers) reach callers as
// bigints, exact beyond Number.MAX_SAFE_INTEGER, and go back to rota unchanged.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import type { sendUnaryData, ServerUnaryCall } from '@grpc/grpc-js';

import { RotaClient } from '../src/index.js';
import type { ReportRequest__Output } from '../src/generated/rota/v1/ReportRequest.js';
import { ackFromMessage, outcomeToMessage } from '../src/types.js';
import { FakeRota } from './fake-rota.js';
import { CapturingLogger } from './harness.js';

const ABOVE_2_53 = 9_007_199_254_740_993n; // 2^53 + 1: a Number would round it to 2^53
const U64_MAX = 18_446_744_073_709_551_615n;

describe('64-bit integers', () => {
  it('keep every digit from a pick to the report of its call', async () => {
    const reports: ReportRequest__Output[] = [];
    const fake = await FakeRota.start({
      balancer: {
        Pick(_call: ServerUnaryCall<unknown, unknown>, callback: sendUnaryData<unknown>) {
          callback(null, {
            instance: { id: 'a', service: 'orders', host: '127.0.0.1', port: 9001, status: 'UP' },
            ticket: ABOVE_2_53.toString(),
            rule: 'round_robin',
            epoch: U64_MAX.toString(),
          });
        },
        Report(call: ServerUnaryCall<ReportRequest__Output, unknown>, callback: sendUnaryData<unknown>) {
          reports.push(call.request);
          callback(null, { accepted: call.request.outcomes.length, ignored: 0 });
        },
      },
    });
    const client = new RotaClient(fake.target, { logger: new CapturingLogger() });
    try {
      const picked = await client.pick('orders');
      assert.equal(picked.ticket, ABOVE_2_53);
      assert.equal(picked.epoch, U64_MAX);
      await client.timed(picked, () => 'done');
      assert.equal(reports[0]?.outcomes[0]?.ticket, ABOVE_2_53.toString());
    } finally {
      await client.close();
      fake.stop();
    }
  });

  it('convert exactly in both directions, and refuse what a uint64 cannot hold', () => {
    const ack = ackFromMessage({
      leaseId: U64_MAX.toString(),
      seq: ABOVE_2_53.toString(),
      accepted: [],
      refused: [],
      heartbeatTimeoutMs: '15000',
    });
    assert.equal(ack.leaseId, U64_MAX);
    assert.equal(ack.seq, ABOVE_2_53);
    assert.equal(ack.heartbeatTimeoutMs, 15_000);
    const outcome = { service: 'orders', instanceId: 'a', latencyUs: 1, result: 'OK' } as const;
    assert.equal(outcomeToMessage({ ...outcome, ticket: U64_MAX }).ticket, U64_MAX.toString());
    assert.equal(outcomeToMessage(outcome).ticket, '0');
    assert.throws(() => outcomeToMessage({ ...outcome, ticket: U64_MAX + 1n }), RangeError);
    assert.throws(() => outcomeToMessage({ ...outcome, ticket: -1n }), RangeError);
  });
});
