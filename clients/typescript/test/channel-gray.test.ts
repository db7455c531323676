// The grpc-js channel against a scripted rota whose Lease answers with picks (a service under
// gray release, leased without a version): every call goes to the instance its pick names and
// carries and reports the pick's ticket; a pick whose instance is not READY is skipped, a gap.
// Then against a live rota with a gray split, one instance killed under the channel.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';
import type { sendUnaryData, ServerUnaryCall, ServerWritableStream } from '@grpc/grpc-js';

import { RotaClient } from '../src/index.js';
import { OPTION_BACKOFF, OPTION_LOGGER, OPTION_SERVER, OPTION_TICKET_HEADER } from '../src/channel/index.js';
import type { CallOutcome__Output } from '../src/generated/rota/v1/CallOutcome.js';
import type { LeaseRequest__Output } from '../src/generated/rota/v1/LeaseRequest.js';
import type { ReportRequest__Output } from '../src/generated/rota/v1/ReportRequest.js';
import { EchoServer, echoCalls, echoPackage, type EchoCall } from './echo.js';
import { FakeRota } from './fake-rota.js';
import { rotaV1 } from '../src/proto.js';
import { RotaServer, closedPort, silentLogger, waitFor } from './harness.js';

interface Member {
  id: string;
  version: string;
  port: number;
}

interface ServedPick {
  id: string;
  ticket: bigint;
  /** Which Lease answer it came in (0, 1, ...), and its index there. */
  block: number;
  index: number;
}

/**
 * The i-th pick of the script: a fixed, irregular pattern over the members (never what a
 * rotation of tickets over them would give), each version drawing tickets from a counter of its
 * own, as rota's rotations do.
 */
function pattern(i: number, members: readonly Member[]): number {
  return [2, 0, 0, 1, 2, 1, 1, 0, 2, 2, 0, 1, 0][i % 13]! % members.length;
}

interface GrayRota {
  fake: FakeRota;
  served: ServedPick[];
  leases: LeaseRequest__Output[];
  outcomes: CallOutcome__Output[];
  /** Adds an instance: later Lease answers name it, and the open watches are told. */
  add(member: Member): void;
}

/**
 * A scripted rota: a Watch snapshot of `members`, Lease answers of picks (`blockSize` of them
 * when given, else as many as asked for), Reports recorded.
 */
async function grayRota(initial: readonly Member[], blockSize?: number): Promise<GrayRota> {
  const members = [...initial];
  const served: ServedPick[] = [];
  const leases: LeaseRequest__Output[] = [];
  const outcomes: CallOutcome__Output[] = [];
  const watches: ServerWritableStream<{ service: string }, unknown>[] = [];
  const counters = new Map<string, bigint>();
  let epoch = 1;
  const instance = (m: Member): object => ({ id: m.id, service: 'gray', host: '127.0.0.1', port: m.port, version: m.version, status: 'UP' });
  const fake = await FakeRota.start({
    registry: {
      Watch(call: ServerWritableStream<{ service: string }, unknown>) {
        watches.push(call);
        call.write({ snapshot: { instances: members.map(instance) }, epoch });
      },
    },
    balancer: {
      Lease(call: ServerUnaryCall<LeaseRequest__Output, unknown>, callback: sendUnaryData<unknown>) {
        leases.push(call.request);
        const picks = [];
        for (let n = 0; n < (blockSize ?? call.request.count); n++) {
          const position = pattern(served.length, members);
          const member = members[position]!;
          const ticket = counters.get(member.version) ?? 0n;
          counters.set(member.version, ticket + 1n);
          served.push({ id: member.id, ticket, block: leases.length - 1, index: n });
          picks.push({ ticket: ticket.toString(), position });
        }
        callback(null, { firstTicket: 0, count: picks.length, instances: members.map(instance), epoch, rule: 'round_robin', fallback: '', picks });
      },
      Report(call: ServerUnaryCall<ReportRequest__Output, unknown>, callback: sendUnaryData<unknown>) {
        outcomes.push(...call.request.outcomes);
        callback(null, { accepted: call.request.outcomes.length, ignored: 0 });
      },
    },
  });
  const add = (m: Member): void => {
    members.push(m);
    members.sort((a, b) => (a.id < b.id ? -1 : 1));
    epoch++;
    for (const w of watches) {
      w.write({ added: instance(m), epoch });
    }
  };
  return { fake, served, leases, outcomes, add };
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

/** The served pick a call used: the same instance and ticket, not used by an earlier call. */
function servedOf(calls: readonly EchoCall[], served: readonly ServedPick[]): ServedPick[] {
  const used = new Set<ServedPick>();
  return calls.map((c) => {
    const p = served.find((s) => !used.has(s) && s.id === c.instance && s.ticket === c.ticket);
    assert.ok(p !== undefined, `a call to ${c.instance} with ticket ${c.ticket} no lease handed out`);
    used.add(p);
    return p;
  });
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

  it('drops the unused picks when the instance list changes', async () => {
    const log: EchoCall[] = [];
    const echoes = await Promise.all(['a', 'b', 'c', 'v'].map((id) => EchoServer.start(id, log)));
    const member = (i: number): Member => ({ id: echoes[i]!.id, version: echoes[i]!.id === 'v' ? 'v2' : '', port: echoes[i]!.port });
    // Blocks of 1,000 picks: the first is far from spent when the list changes.
    const rota = await grayRota([member(0), member(1), member(3)], 1_000);
    const client = channel(rota.fake.target);
    try {
      assert.deepEqual((await echoCalls(client, 3, '', 5_000)).filter((r) => r.error !== undefined), []);
      const blocksBefore = rota.leases.length;
      rota.add(member(2));
      // Calls until one is routed by a lease answered after the change (bounded).
      let after = -1;
      for (let n = 0; n < 200 && after < 0; n++) {
        const [r] = await echoCalls(client, 1, '', 5_000);
        assert.equal(r!.error, undefined);
        if (servedOf(log.slice(-1), rota.served)[0]!.block >= blocksBefore) {
          after = log.length - 1;
        }
      }
      assert.ok(after >= 0, 'no call was routed by a lease answered after the change');
      const used = servedOf(log, rota.served);
      // Before: the first block's picks in order, most of it never used; after: the first pick
      // of a block answered after the change, and none of the first block again.
      assert.deepEqual(used.slice(0, after).map((p) => [p.block, p.index]), used.slice(0, after).map((_, i) => [0, i]));
      assert.ok(after < 1_000);
      assert.equal(used[after]!.index, 0);
      assert.ok(used[after]!.block >= blocksBefore);
      for (let i = 0; i < 20; i++) {
        assert.equal((await echoCalls(client, 1, '', 5_000))[0]!.error, undefined);
      }
      const later = servedOf(log, rota.served).slice(after);
      assert.deepEqual(later.map((p) => [p.block, p.index]), later.map((_, i) => [used[after]!.block, i]));
      assert.ok(later.some((p) => p.id === 'c'), 'no call reached the added instance');
    } finally {
      client.close();
      rota.fake.stop();
      echoes.forEach((e) => e.kill());
    }
  });
});

describe('gray release against a live rota', { timeout: 60_000 }, () => {
  it('follows the split without a version, and passes over a killed instance without failed calls', async () => {
    const server = await RotaServer.start();
    const log: EchoCall[] = [];
    const echoes = await Promise.all(['a', 'b', 'v'].map((id) => EchoServer.start(id, log)));
    const provider = new RotaClient(server.target, { logger: silentLogger });
    const policies = new (rotaV1().Policies)(server.target, grpc.credentials.createInsecure());
    let client: grpc.Client | undefined;
    try {
      await provider.register(echoes.map((e) => ({ id: e.id, service: 'gray', host: '127.0.0.1', port: e.port, ...(e.id === 'v' ? { version: 'v2' } : {}) })));
      await new Promise<void>((resolve, reject) =>
        policies.SetPolicy({ policy: { service: 'gray', gray: { unversioned: 2, versions: { v2: 1 } } } }, { deadline: Date.now() + 5_000 }, (error: grpc.ServiceError | null) =>
          error !== null ? reject(error) : resolve(),
        ),
      );
      client = channel(server.target);
      const first = await echoCalls(client, 30, '', 5_000);
      assert.deepEqual(first.filter((r) => r.error !== undefined), []);
      const count = (id: string): number => log.filter((c) => c.instance === id).length;
      assert.deepEqual([count('a'), count('b'), count('v')], [10, 10, 10], 'the 2:1 split, round robin among the unversioned');
      assert.ok(log.every((c) => c.ticket >= 0n), 'every call carried its pick ticket');
      echoes[2]!.kill();
      // A call already on its way to v when it died may fail. Six calls in a row span one of
      // v's picks (every third), which the channel can only have passed over: then none may.
      let inARow = 0;
      for (let n = 0; n < 60 && inARow < 6; n++) {
        inARow = (await echoCalls(client, 1, '', 5_000))[0]!.error === undefined ? inARow + 1 : 0;
      }
      assert.equal(inARow, 6, 'six calls in a row did not succeed after v was killed');
      const before = log.length;
      const rest = await echoCalls(client, 30, '', 5_000);
      assert.deepEqual(rest.filter((r) => r.error !== undefined).map((r) => r.error!.details), []);
      const later = log.slice(before);
      assert.equal(later.length, 30);
      assert.ok(later.every((c) => (c.instance === 'a' || c.instance === 'b') && c.ticket >= 0n), JSON.stringify(later.map((c) => c.instance)));
    } finally {
      client?.close();
      policies.close();
      await provider.close();
      echoes.forEach((e) => e.kill());
      await server.stop();
    }
  });
});
