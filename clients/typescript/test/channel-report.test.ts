// What the grpc-js channel sends besides the call: outcome reports batched off the call path
// (against a recording stand-in for rota), and the x-rota-ticket metadata only when asked for.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';
import type { sendUnaryData, ServerUnaryCall } from '@grpc/grpc-js';

import { RotaClient } from '../src/index.js';
import { OPTION_LOGGER, OPTION_SERVER, OPTION_TICKET_HEADER } from '../src/channel/index.js';
import { RotaLink } from '../src/channel/link.js';
import type { CallOutcome } from '../src/generated/rota/v1/CallOutcome.js';
import type { ReportRequest__Output } from '../src/generated/rota/v1/ReportRequest.js';
import { EchoServer, echoCalls, echoPackage, type EchoCall } from './echo.js';
import { FakeRota } from './fake-rota.js';
import { CapturingLogger, RotaServer, silentLogger, waitFor } from './harness.js';

const HOUR_MS = 3_600_000;

function outcome(ticket: number): CallOutcome {
  return { service: 'echo', instanceId: 'a', ticket: String(ticket), rule: 'round_robin', latencyUs: '10', result: 'CALL_RESULT_OK' };
}

/** A stand-in for rota that records each Report, or fails it while `down`. */
async function recorder(): Promise<{ fake: FakeRota; reports: ReportRequest__Output[]; state: { down: boolean; failed: number } }> {
  const reports: ReportRequest__Output[] = [];
  const state = { down: false, failed: 0 };
  const fake = await FakeRota.start({
    balancer: {
      Report(call: ServerUnaryCall<ReportRequest__Output, unknown>, callback: sendUnaryData<unknown>) {
        if (state.down) {
          state.failed++;
          callback({ code: grpc.status.UNAVAILABLE, details: 'down' });
          return;
        }
        reports.push(call.request);
        callback(null, { accepted: call.request.outcomes.length, ignored: 0 });
      },
    },
  });
  return { fake, reports, state };
}

describe('channel outcome reports', () => {
  it('sends a full batch without waiting for the interval', async () => {
    const { fake, reports } = await recorder();
    const link = new RotaLink(fake.target, 'echo', silentLogger, { initialMs: 10, maxMs: 100 }, undefined, HOUR_MS);
    try {
      for (let i = 0; i < 1_000; i++) {
        link.report(outcome(i));
      }
      await waitFor(() => reports.length === 1, { what: 'a Report of the full batch' });
      const sent = reports[0]!.outcomes;
      assert.equal(sent.length, 1_000);
      assert.deepEqual(
        sent.map((o) => o.ticket),
        Array.from({ length: 1_000 }, (_, i) => String(i)),
      );
      assert.ok(sent.every((o) => o.leased && o.service === 'echo'));
    } finally {
      link.close();
      fake.stop();
    }
  });

  it('keeps the newest outcomes while rota is away, drops and counts the oldest', async () => {
    const { fake, reports, state } = await recorder();
    state.down = true;
    const logger = new CapturingLogger();
    const link = new RotaLink(fake.target, 'echo', logger, { initialMs: 10, maxMs: 100 }, undefined, 20);
    try {
      for (let i = 0; i < 21_500; i++) {
        link.report(outcome(i));
      }
      assert.equal(link.droppedOutcomes, 1_500);
      await waitFor(() => state.failed >= 2, { what: 'failed Reports' });
      assert.equal(link.droppedOutcomes, 1_500, 'a failed Report drops nothing more');
      state.down = false;
      await waitFor(() => reports.reduce((n, r) => n + r.outcomes.length, 0) >= 20_000, { what: 'the held outcomes reported' });
      const tickets = reports.flatMap((r) => r.outcomes.map((o) => Number(o.ticket)));
      assert.deepEqual(
        tickets,
        Array.from({ length: 20_000 }, (_, i) => 1_500 + i),
      );
      assert.ok(reports.every((r) => r.outcomes.length <= 1_000));
      assert.equal(logger.lines.filter((w) => w.includes('dropping')).length, 1, logger.lines.join('\n'));
    } finally {
      link.close();
      fake.stop();
    }
  });
});

describe('channel outcome reports at close', () => {
  it('sends every queued outcome before the connection closes, a Report under way included', async () => {
    const { fake, reports } = await recorder();
    // An interval of an hour: nothing but close() sends the queue.
    const link = new RotaLink(fake.target, 'echo', silentLogger, { initialMs: 10, maxMs: 100 }, undefined, HOUR_MS);
    try {
      // A full batch starts a Report at once; 1,500 more wait behind it when close() comes.
      for (let i = 0; i < 2_500; i++) {
        link.report(outcome(i));
      }
      link.close();
      await waitFor(() => reports.reduce((n, r) => n + r.outcomes.length, 0) === 2_500, { what: 'every outcome reported' });
      const tickets = reports.flatMap((r) => r.outcomes.map((o) => Number(o.ticket)));
      assert.deepEqual(
        tickets,
        Array.from({ length: 2_500 }, (_, i) => i),
      );
      assert.equal(link.droppedOutcomes, 0);
    } finally {
      fake.stop();
    }
  });

  it('drops what rota does not take while closing, and never calls on a closed connection', async () => {
    const { fake, state } = await recorder();
    state.down = true;
    const link = new RotaLink(fake.target, 'echo', silentLogger, { initialMs: 10, maxMs: 100 }, undefined, HOUR_MS);
    try {
      for (let i = 0; i < 1_200; i++) {
        link.report(outcome(i));
      }
      link.close();
      await waitFor(() => link.droppedOutcomes === 1_200, { what: 'the refused outcomes dropped' });
      assert.equal(state.failed, 1, 'one failed Report ends the drain');
      // A call that ends after the connection closed: its outcome goes nowhere, no throw.
      link.report(outcome(9_999));
      assert.equal(link.droppedOutcomes, 1_201);
    } finally {
      fake.stop();
    }
  });
});

describe('x-rota-ticket', { timeout: 60_000 }, () => {
  it('is sent only when the channel asks for it', async () => {
    const server = await RotaServer.start();
    const rota = await RotaClient.connect(server.target, { logger: silentLogger });
    const log: EchoCall[] = [];
    const echoes = [await EchoServer.start('a', log), await EchoServer.start('b', log)];
    const registration = await rota.register(echoes.map((e) => ({ id: e.id, service: 'tickets', host: '127.0.0.1', port: e.port })));
    const run = async (options: object): Promise<EchoCall[]> => {
      const before = log.length;
      const client = new (echoPackage().Echo)('rota:///tickets', grpc.credentials.createInsecure(), {
        [OPTION_SERVER]: server.target,
        [OPTION_LOGGER]: silentLogger,
        ...options,
      }) as grpc.Client;
      try {
        const results = await echoCalls(client, 20, '', 10_000);
        assert.ok(results.every((r) => r.error === undefined), JSON.stringify(results));
      } finally {
        client.close();
      }
      return log.slice(before);
    };
    try {
      assert.ok((await run({})).every((c) => c.ticket === -1n), 'no ticket without the option');
      const opted = await run({ [OPTION_TICKET_HEADER]: true });
      assert.deepEqual(
        opted.map((c) => c.ticket),
        opted.map((_, i) => opted[0]!.ticket + BigInt(i)),
      );
      assert.ok(opted[0]!.ticket >= 0n);
    } finally {
      await registration.close();
      await rota.close();
      echoes.forEach((e) => e.kill());
      await server.stop();
    }
  });
});
