import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import type { sendUnaryData, ServerUnaryCall } from '@grpc/grpc-js';

import { RotaClient, type PickResult } from '../src/index.js';
import type { ReportRequest__Output } from '../src/generated/rota/v1/ReportRequest.js';
import { FakeRota } from './fake-rota.js';
import { CapturingLogger } from './harness.js';

const picked: PickResult = {
  instance: {
    id: 'a',
    service: 'orders',
    host: '127.0.0.1',
    port: 9001,
    version: '',
    zone: '',
    weight: 100,
    metadata: {},
    status: 'UP',
  },
  ticket: 41n,
  rule: 'repeat(n=3)',
  fallback: '',
  epoch: 2n,
  localFallback: false,
};

describe('RotaClient.timed', () => {
  async function recorder(reports: ReportRequest__Output[]): Promise<FakeRota> {
    return FakeRota.start({
      balancer: {
        Report(call: ServerUnaryCall<ReportRequest__Output, unknown>, callback: sendUnaryData<unknown>) {
          reports.push(call.request);
          callback(null, { accepted: call.request.outcomes.length, ignored: 0 });
        },
      },
    });
  }

  it('returns the result and reports OK with the latency', async () => {
    const reports: ReportRequest__Output[] = [];
    const fake = await recorder(reports);
    const client = new RotaClient(fake.target, { logger: new CapturingLogger() });
    try {
      const value = await client.timed(picked, async (instance) => {
        await new Promise((resolve) => setTimeout(resolve, 30));
        return `${instance.host}:${instance.port}`;
      });
      assert.equal(value, '127.0.0.1:9001');
      assert.equal(reports.length, 1);
      const [outcome] = reports[0]?.outcomes ?? [];
      assert.ok(outcome !== undefined);
      assert.equal(outcome.service, 'orders');
      assert.equal(outcome.instanceId, 'a');
      // The fake decodes with the client's loader options: 64-bit integers as decimal strings.
      assert.equal(outcome.ticket, '41');
      assert.equal(outcome.rule, 'repeat(n=3)');
      assert.equal(outcome.result, 'CALL_RESULT_OK');
      const latencyUs = Number(outcome.latencyUs);
      assert.ok(latencyUs >= 25_000 && latencyUs < 5_000_000, `latency ${latencyUs} us`);
    } finally {
      await client.close();
      fake.stop();
    }
  });

  it('rethrows the error and reports it, as a connect failure when the instance was unreachable', async () => {
    const reports: ReportRequest__Output[] = [];
    const fake = await recorder(reports);
    const client = new RotaClient(fake.target, { logger: new CapturingLogger() });
    try {
      const failure = new Error('HTTP 503');
      await assert.rejects(
        client.timed(picked, () => {
          throw failure;
        }),
        (error: unknown) => error === failure,
      );
      const refused = Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
      await assert.rejects(
        client.timed(picked, async () => Promise.reject(refused)),
        (error: unknown) => error === refused,
      );
      await assert.rejects(
        client.timed(
          picked,
          () => {
            throw failure;
          },
          { classify: () => 'CONNECT_FAILURE' },
        ),
        (error: unknown) => error === failure,
      );
      assert.deepEqual(
        reports.map((r) => r.outcomes.map((o) => o.result)),
        [['CALL_RESULT_ERROR'], ['CALL_RESULT_CONNECT_FAILURE'], ['CALL_RESULT_CONNECT_FAILURE']],
      );
    } finally {
      await client.close();
      fake.stop();
    }
  });

  it('neither reports local fallback picks nor fails when reporting fails', async () => {
    const reports: ReportRequest__Output[] = [];
    const fake = await recorder(reports);
    const logger = new CapturingLogger();
    const client = new RotaClient(fake.target, { logger, timeoutMs: 500 });
    try {
      assert.equal(await client.timed({ ...picked, localFallback: true }, () => 1), 1);
      assert.equal(reports.length, 0);
      fake.stop();
      assert.equal(await client.timed(picked, () => 2), 2);
      assert.equal(logger.lines.length, 1);
      assert.match(logger.lines[0] ?? '', /^rota: reporting a call outcome failed \((UNAVAILABLE|DEADLINE_EXCEEDED): /);
    } finally {
      await client.close();
      fake.stop();
    }
  });
});
