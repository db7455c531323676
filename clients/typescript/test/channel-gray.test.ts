// The grpc-js channel against a scripted rota whose Lease answers with picks (a service under
// gray release, leased without a version): every call goes to the instance its pick names and
// carries and reports the pick's ticket; a pick whose instance is not READY is skipped, a gap.

import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';
import type { sendUnaryData, ServerUnaryCall, ServerWritableStream } from '@grpc/grpc-js';

import { OPTION_BACKOFF, OPTION_LOGGER, OPTION_SERVER, OPTION_TICKET_HEADER } from '../src/channel/index.js';
import type { CallOutcome__Output } from '../src/generated/rota/v1/CallOutcome.js';
import type { LeaseRequest__Output } from '../src/generated/rota/v1/LeaseRequest.js';
import type { ReportRequest__Output } from '../src/generated/rota/v1/ReportRequest.js';
import { EchoServer, echoCalls, echoPackage, type EchoCall } from './echo.js';
import { FakeRota } from './fake-rota.js';
import { silentLogger, waitFor } from './harness.js';

interface Member {
  id: string;
  version: string;
  port: number;
}

interface ServedPick {
  id: string;
  ticket: bigint;
}

/**
 * The i-th pick of the script: a fixed, irregular pattern over the members (never what a
 * rotation of tickets over them would give), each version drawing tickets from a counter of its
 * own, as rota's rotations do.
 */
function pattern(i: number, members: readonly Member[]): number {
  return [2, 0, 0, 1, 2, 1, 1, 0, 2, 2, 0, 1, 0][i % 13]! % members.length;
}

/** A scripted rota: a Watch snapshot of `members`, Lease answers of picks, Reports recorded. */
async function grayRota(members: readonly Member[]): Promise<{ fake: FakeRota; served: ServedPick[]; leases: LeaseRequest__Output[]; outcomes: CallOutcome__Output[] }> {
  const served: ServedPick[] = [];
  const leases: LeaseRequest__Output[] = [];
  const outcomes: CallOutcome__Output[] = [];
  const counters = new Map<string, bigint>();
  const instances = members.map((m) => ({ id: m.id, service: 'gray', host: '127.0.0.1', port: m.port, version: m.version, status: 'UP' }));
  const fake = await FakeRota.start({
    registry: {
      Watch(call: ServerWritableStream<{ service: string }, unknown>) {
        call.write({ snapshot: { instances }, epoch: 1 });
      },
    },
    balancer: {
      Lease(call: ServerUnaryCall<LeaseRequest__Output, unknown>, callback: sendUnaryData<unknown>) {
        leases.push(call.request);
        const picks = [];
        for (let n = 0; n < call.request.count; n++) {
          const position = pattern(served.length, members);
          const member = members[position]!;
          const ticket = counters.get(member.version) ?? 0n;
          counters.set(member.version, ticket + 1n);
          served.push({ id: member.id, ticket });
          picks.push({ ticket: ticket.toString(), position });
        }
        callback(null, { firstTicket: 0, count: picks.length, instances, epoch: 1, rule: 'round_robin', fallback: '', picks });
      },
      Report(call: ServerUnaryCall<ReportRequest__Output, unknown>, callback: sendUnaryData<unknown>) {
        outcomes.push(...call.request.outcomes);
        callback(null, { accepted: call.request.outcomes.length, ignored: 0 });
      },
    },
  });
  return { fake, served, leases, outcomes };
}

/** A loopback port nothing listens on: connections to it are refused. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  assert.ok(address !== null && typeof address === 'object');
  return address.port;
}

function channel(target: string): grpc.Client {
  return new (echoPackage().Echo)('rota:///gray', grpc.credentials.createInsecure(), {
    [OPTION_SERVER]: target,
    [OPTION_TICKET_HEADER]: true,
    [OPTION_LOGGER]: silentLogger,
    [OPTION_BACKOFF]: { initialMs: 20, maxMs: 200 },
  });
}

function described(calls: readonly (EchoCall | ServedPick)[]): string[] {
  return calls.map((c) => `${'instance' in c ? c.instance : c.id}#${c.ticket}`);
}

describe('gray leases (picks rota mapped itself)', { timeout: 60_000 }, () => {
  it('routes each call to the instance its pick names, in order, with the pick ticket', async () => {
    const log: EchoCall[] = [];
    const echoes = await Promise.all(['a', 'b', 'v'].map((id) => EchoServer.start(id, log)));
    const members = echoes.map((e) => ({ id: e.id, version: e.id === 'v' ? 'v2' : '', port: e.port }));
    const { fake, served, leases, outcomes } = await grayRota(members);
    const client = channel(fake.target);
    try {
      const results = await echoCalls(client, 60, '', 5_000);
      assert.deepEqual(results.filter((r) => r.error !== undefined), []);
      assert.ok(leases.length >= 2 && leases.every((l) => l.version === '' && l.service === 'gray'), JSON.stringify(leases));
      assert.deepEqual(described(log), described(served.slice(0, 60)));
      assert.deepEqual(
        results.map((r) => r.instance),
        log.map((c) => c.instance),
      );
      await waitFor(() => outcomes.length >= 60, { what: 'the outcomes of the calls reported' });
      assert.deepEqual(
        outcomes.slice(0, 60).map((o) => `${o.instanceId}#${o.ticket}`),
        described(served.slice(0, 60)),
      );
      assert.ok(outcomes.every((o) => o.rule === 'round_robin' && o.leased && o.result === 'CALL_RESULT_OK'));
    } finally {
      client.close();
      fake.stop();
      echoes.forEach((e) => e.kill());
    }
  });

  it('skips a pick whose instance is not READY, leaving its ticket unused', async () => {
    const log: EchoCall[] = [];
    const echoes = await Promise.all(['a', 'b'].map((id) => EchoServer.start(id, log)));
    // The v2 instance refuses connections: its subchannel never becomes READY.
    const members = [...echoes.map((e) => ({ id: e.id, version: '', port: e.port })), { id: 'v', version: 'v2', port: await closedPort() }];
    const { fake, served } = await grayRota(members);
    const client = channel(fake.target);
    try {
      const results = await echoCalls(client, 40, '', 5_000);
      assert.deepEqual(results.filter((r) => r.error !== undefined), []);
      const reachable = served.filter((p) => p.id !== 'v');
      assert.deepEqual(described(log), described(reachable.slice(0, 40)));
      assert.ok(served.slice(0, served.indexOf(reachable[39]!)).some((p) => p.id === 'v'), 'the script named v before the 40th call');
    } finally {
      client.close();
      fake.stop();
      echoes.forEach((e) => e.kill());
    }
  });
});
