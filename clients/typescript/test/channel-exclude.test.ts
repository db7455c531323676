// The grpc-js channel against a scripted rota whose Lease answers ticket ranges with positions
// of its own choosing: every call goes to the instance the position of its ticket names; an
// instance that refuses connections is named in each Lease's `exclude`, and while a block still
// maps tickets to it, those tickets are passed over (gaps) and the calls take the next ones.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';
import type { sendUnaryData, ServerUnaryCall, ServerWritableStream } from '@grpc/grpc-js';

import { OPTION_BACKOFF, OPTION_LOGGER, OPTION_SERVER, OPTION_TICKET_HEADER } from '../src/channel/index.js';
import type { LeaseRequest__Output } from '../src/generated/rota/v1/LeaseRequest.js';
import { EchoServer, echoCalls, echoPackage, type EchoCall } from './echo.js';
import { FakeRota } from './fake-rota.js';
import { closedPort, silentLogger } from './harness.js';


/** An irregular position over `n` instances for ticket t: no rule's mapping. */
function irregular(t: bigint, n: number): number {
  return [2, 0, 1, 1, 0, 2, 2, 1, 0, 0, 1][Number(t % 11n)]! % n;
}

describe('channel routing by leased positions, with an unreachable instance', { timeout: 60_000 }, () => {
  it('follows the positions, names the unreachable instance in exclude, and passes over its tickets', async () => {
    const log: EchoCall[] = [];
    const echoes = await Promise.all(['a', 'b'].map((id) => EchoServer.start(id, log)));
    const members = [...echoes.map((e) => ({ id: e.id, port: e.port })), { id: 'c', port: await closedPort() }];
    const instance = (m: { id: string; port: number }): object => ({ id: m.id, service: 'svc', host: '127.0.0.1', port: m.port, version: '', status: 'UP', weight: 100 });
    const leases: LeaseRequest__Output[] = [];
    /** The instance each ticket was leased for. */
    const leasedTo = new Map<bigint, string>();
    let next = 0n;
    const fake = await FakeRota.start({
      registry: {
        Watch(call: ServerWritableStream<{ service: string }, unknown>) {
          call.write({ snapshot: { instances: members.map(instance) }, epoch: 1 });
        },
      },
      balancer: {
        Lease(call: ServerUnaryCall<LeaseRequest__Output, unknown>, callback: sendUnaryData<unknown>) {
          leases.push(call.request);
          // The first answer ignores `exclude` (as if c had been usable when it was asked): its
          // tickets of c are the channel's to pass over. Later ones leave the excluded out.
          const kept = leases.length === 1 ? members : members.filter((m) => !call.request.exclude.includes(m.id));
          const first = next;
          next += BigInt(call.request.count);
          const positions = Array.from({ length: call.request.count }, (_, i) => irregular(first + BigInt(i), kept.length));
          positions.forEach((p, i) => leasedTo.set(first + BigInt(i), kept[p]!.id));
          callback(null, { firstTicket: first.toString(), count: call.request.count, instances: kept.map(instance), epoch: 1, rule: 'round_robin', fallback: '', positions, picks: [] });
        },
        Report(call: ServerUnaryCall<{ outcomes: unknown[] }, unknown>, callback: sendUnaryData<unknown>) {
          callback(null, { accepted: call.request.outcomes.length, ignored: 0 });
        },
      },
    });
    const client = new (echoPackage().Echo)('rota:///svc', grpc.credentials.createInsecure(), {
      [OPTION_SERVER]: fake.target,
      [OPTION_TICKET_HEADER]: true,
      [OPTION_LOGGER]: silentLogger,
      [OPTION_BACKOFF]: { initialMs: 20, maxMs: 200 },
    });
    try {
      const results = await echoCalls(client, 60, '', 5_000);
      assert.deepEqual(results.filter((r) => r.error !== undefined), []);
      assert.equal(log.length, 60);
      // Each call reached the instance its ticket was leased for, each ticket once.
      assert.deepEqual(
        log.map((c) => `${c.ticket}:${c.instance}`),
        log.map((c) => `${c.ticket}:${leasedTo.get(c.ticket)}`),
      );
      assert.equal(new Set(log.map((c) => c.ticket)).size, 60);
      // The first block's tickets of c were passed over: gaps, never sent.
      const firstBlock = leases[0]!.count;
      const skipped = [...leasedTo].filter(([t, id]) => t < BigInt(firstBlock) && id === 'c').map(([t]) => t);
      assert.ok(skipped.length > 0, 'the first block maps some ticket to c');
      assert.ok(log.every((c) => !skipped.includes(c.ticket)));
      // Every Lease named c, which never became READY, in its exclude.
      assert.ok(leases.length >= 2, `${leases.length} leases`);
      assert.deepEqual(
        leases.map((l) => l.exclude),
        leases.map(() => ['c']),
      );
      // After the first block the tickets map over a and b only: no more gaps.
      const later = log.filter((c) => c.ticket >= BigInt(firstBlock)).map((c) => c.ticket);
      assert.ok(later.length > 0);
      assert.deepEqual(
        later,
        later.map((_, i) => later[0]! + BigInt(i)),
      );
    } finally {
      client.close();
      fake.stop();
      echoes.forEach((e) => e.kill());
    }
  });
});
