// The lease stream of the grpc-js channel against a scripted Lease: consecutive tickets with the
// positions rota sent (any rule), answers it cannot use refused, the unusable instances named in
// each lease's `exclude`, the bounded growth of the lease size, the local rotation while rota is
// unreachable, and the picks of leases rota mapped itself (gray release without a version).

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Metadata, status } from '@grpc/grpc-js';

import { Leaser, MAX_LEASE, type Draw, type LeaseView, type VersionStream } from '../src/channel/lease.js';
import type { RotaLink } from '../src/channel/link.js';

const GRAY_INSTANCES = [
  { id: 'a', host: '127.0.0.1', port: 1, version: '', weight: 100 },
  { id: 'b', host: '127.0.0.1', port: 2, version: '', weight: 100 },
  { id: 'v', host: '127.0.0.1', port: 3, version: 'v2', weight: 100 },
];

/** Positions of the gray picks, in a pattern no ticket rotation over the three would give. */
const GRAY_PATTERN = [2, 0, 0, 1, 2, 1, 1];

/** The i-th pick rota maps for a gray lease, with a ticket of its own. */
function grayPick(i: number): { ticket: bigint; position: number } {
  return { ticket: 1_000n + BigInt(i), position: GRAY_PATTERN[i % GRAY_PATTERN.length]! };
}

function grayId(i: number): string {
  return GRAY_INSTANCES[grayPick(i).position]!.id;
}

class ScriptedLeases {
  next = 0n;
  counts: number[] = [];
  down = false;
  /** Answer with picks (a gray lease) rather than a ticket range. */
  gray = false;
  /** Picks handed out so far across gray leases. */
  picks = 0;
  /** A position past the instance list in the next gray answer. */
  badPosition = false;
  /** Refuse leases as a restarted rota does before the service is back (NOT_FOUND, rota-error). */
  refuse = false;
  /** Refuse a lease whose exclude names `b`, as rota refuses one that leaves it no instance. */
  refuseExcluded = false;
  /** Lease requests made so far. */
  requests = 0;
  /** The rule of ticket-range answers. */
  rule = 'round_robin';
  /** The positions of a ticket-range answer of tickets first .. first + count - 1. */
  positions: (first: bigint, count: number) => number[] = (first, count) => Array.from({ length: count }, (_, i) => Number((first + BigInt(i)) % 2n));
  /** The `exclude` of each Lease request, in order. */
  excludes: string[][] = [];
  /** What the leaser asked to hear when the Watch ends. */
  watchLost: (() => void) | undefined;
  /** Called when a Lease request is made (synchronously, from the stream's take()). */
  onRequest: () => void = () => {};

  link(): RotaLink {
    return {
      service: 'svc',
      backoff: { initialMs: 1, maxMs: 2 },
      logger: { warn() {} },
      offline() {},
      online() {},
      report() {},
      onWatchLost: (listener: () => void) => {
        this.watchLost = listener;
        return () => {
          this.watchLost = undefined;
        };
      },
      balancer: {
        Lease: (request: { count: number; exclude: string[] }, _md: Metadata, _opts: object, callback: (e: unknown, r?: unknown) => void) => {
          this.requests++;
          this.excludes.push(request.exclude);
          this.onRequest();
          setImmediate(() => {
            if (this.gray && !this.down) {
              this.counts.push(request.count);
              const picks = Array.from({ length: request.count }, (_, i) => grayPick(this.picks + i));
              this.picks += request.count;
              if (this.badPosition) {
                picks[0] = { ticket: 0n, position: 3 };
              }
              callback(null, {
                firstTicket: '0',
                count: request.count,
                rule: 'round_robin',
                instances: GRAY_INSTANCES,
                picks: picks.map((p) => ({ ticket: p.ticket.toString(), position: p.position })),
              });
              return;
            }
            if (this.down) {
              callback(Object.assign(new Error('connection refused'), { code: status.UNAVAILABLE, details: 'connection refused', metadata: new Metadata() }));
              return;
            }
            if (this.refuseExcluded && request.exclude.includes('b')) {
              const metadata = new Metadata();
              metadata.set('rota-error', 'no_eligible_instance');
              const details = 'service "svc" has no eligible instance for a lease that is not excluded';
              callback(Object.assign(new Error(details), { code: status.UNAVAILABLE, details, metadata }));
              return;
            }
            if (this.refuse) {
              const metadata = new Metadata();
              metadata.set('rota-error', 'unknown_service');
              callback(Object.assign(new Error('unknown'), { code: status.NOT_FOUND, details: 'service "svc" has never been registered', metadata }));
              return;
            }
            this.counts.push(request.count);
            const first = this.next;
            this.next += BigInt(request.count);
            callback(null, {
              firstTicket: first.toString(),
              count: request.count,
              rule: this.rule,
              instances: [
                { id: 'a', host: '127.0.0.1', port: 1, version: '', weight: 100 },
                { id: 'b', host: '127.0.0.1', port: 2, version: '', weight: 100 },
              ],
              positions: this.positions(first, request.count),
              picks: [],
            });
          });
        },
      },
    } as unknown as RotaLink;
  }
}

/** The next ticket, waiting (bounded) for a wake-up when the stream asks to wait. */
async function take(stream: VersionStream, woken: () => Promise<void>): Promise<Draw> {
  for (let attempt = 0; attempt < 100; attempt++) {
    const taken = stream.take();
    if (taken.kind === 'ticket') {
      return taken.draw;
    }
    assert.equal(taken.kind, 'wait', taken.kind === 'error' ? taken.details : '');
    await woken();
  }
  throw new Error('no ticket after 100 waits');
}

function leaser(
  script: ScriptedLeases,
  localView: (version: string) => LeaseView | undefined = () => undefined,
  unusable: () => readonly string[] = () => [],
): { stream: VersionStream; leases: Leaser; woken: () => Promise<void>; close: () => void } {
  let wake: (() => void) | undefined;
  const leases = new Leaser(script.link(), '', () => wake?.(), localView, unusable);
  const woken = (): Promise<void> =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no wake-up within 10 s')), 10_000);
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  return { stream: leases.stream(''), leases, woken, close: () => leases.close() };
}

describe('lease stream', () => {
  it('hands out consecutive tickets and grows the lease size with the rate, within bounds', async () => {
    const script = new ScriptedLeases();
    const { stream, woken, close } = leaser(script);
    try {
      for (let want = 0n; want < 100_000n; want++) {
        const draw = await take(stream, woken);
        assert.equal(draw.ticket, want);
        assert.equal(draw.local, false);
      }
    } finally {
      close();
    }
    assert.equal(script.counts[0], 16);
    for (let i = 1; i < script.counts.length; i++) {
      assert.ok(script.counts[i]! <= MAX_LEASE && script.counts[i]! <= script.counts[i - 1]! * 16, `lease sizes ${script.counts.join(',')}`);
    }
    assert.ok(script.counts.at(-1)! >= 4096, `a fast caller should lease thousands at once: ${script.counts.join(',')}`);
  });

  it('falls back to a local rotation over the last list while rota is down, and back to leases', async () => {
    const script = new ScriptedLeases();
    const { stream, woken, close } = leaser(script);
    try {
      await take(stream, woken);
      script.down = true;
      const local: Draw[] = [];
      for (let n = 0; n < 10_000 && local.length < 4; n++) {
        const draw = await take(stream, woken);
        if (draw.local) {
          local.push(draw);
        }
      }
      assert.equal(local.length, 4, 'no local rotation while rota is down');
      // Over the last leased list, a local counter from 0, no position: the picker turns the
      // counter over the usable instances of the list.
      assert.deepEqual(
        local.map((d) => [d.ticket, d.position, d.view.ids]),
        [0n, 1n, 2n, 3n].map((t) => [t, undefined, ['a', 'b']]),
      );
      script.down = false;
      // The retry timer (1–2 ms backoff here) leases again; wait for a leased ticket, bounded.
      const deadline = Date.now() + 10_000;
      let leased = false;
      while (!leased && Date.now() < deadline) {
        leased = !(await take(stream, woken)).local;
        await new Promise((resolve) => setImmediate(resolve));
      }
      assert.ok(leased, 'still local after rota answered again');
    } finally {
      close();
    }
  });
});

describe('lease stream when rota goes away and comes back', () => {
  it('drops the tickets it holds when the Watch ends, and leases afresh', async () => {
    const script = new ScriptedLeases();
    const { stream, woken, close } = leaser(script);
    try {
      const first = await take(stream, woken);
      assert.equal(first.local, false);
      const requests = script.requests;
      // Every ticket leased so far (held or not) is below this one.
      const fresh = script.next;
      assert.ok(script.watchLost !== undefined, 'the leaser listens for the end of the Watch');
      // rota restarted: the tickets held past `first` may be the new rota's to give again.
      script.watchLost();
      const next = await take(stream, woken);
      assert.equal(next.local, false);
      assert.ok(script.requests > requests, 'a new lease, not the rest of the old block');
      assert.ok(next.ticket >= fresh, `ticket ${next.ticket} comes from a block held before the Watch ended (new leases start at ${fresh})`);
    } finally {
      close();
    }
    assert.equal(script.watchLost, undefined, 'a closed leaser stops listening');
  });

  it('keeps retrying while offline when the answer is a refusal, and leases once rota serves again', async () => {
    const script = new ScriptedLeases();
    const { stream, woken, close } = leaser(script);
    try {
      await take(stream, woken);
      script.down = true;
      let local = false;
      for (let n = 0; n < 10_000 && !local; n++) {
        local = (await take(stream, woken)).local;
      }
      assert.ok(local, 'offline: a local rotation');
      // rota is back but has not seen the service again yet: it refuses the lease.
      script.down = false;
      script.refuse = true;
      const refusedFrom = script.requests;
      const deadline = Date.now() + 10_000;
      while (script.requests < refusedFrom + 3 && Date.now() < deadline) {
        await take(stream, woken);
        await new Promise((resolve) => setImmediate(resolve));
      }
      assert.ok(script.requests >= refusedFrom + 3, 'the retries went on after a refusal');
      script.refuse = false;
      let leased = false;
      while (!leased && Date.now() < deadline) {
        leased = !(await take(stream, woken)).local;
        await new Promise((resolve) => setImmediate(resolve));
      }
      assert.ok(leased, 'still local after rota served the lease again');
    } finally {
      close();
    }
  });
});

/** The instance a draw routes its call to: the position rota sent for its ticket or pick. */
function routed(draw: Draw): string {
  assert.notEqual(draw.position, undefined, `ticket ${draw.ticket} has no position`);
  return draw.view.ids[draw.position!]!;
}

/** A pattern of positions over two instances that no rule's mapping gives ticket by ticket. */
function irregular(first: bigint, count: number): number[] {
  return Array.from({ length: count }, (_, i) => [1, 1, 0, 1, 0, 0, 0][Number((first + BigInt(i)) % 7n)]!);
}

describe('lease stream routing by the positions rota sent', () => {
  it('hands out each ticket with its position, whatever the rule, across blocks', async () => {
    const script = new ScriptedLeases();
    script.rule = 'some_rule(n=2)';
    script.positions = irregular;
    const { stream, woken, close } = leaser(script);
    try {
      for (let t = 0n; t < 200n; t++) {
        const draw = await take(stream, woken);
        assert.equal(draw.ticket, t);
        assert.equal(draw.position, irregular(t, 1)[0], `ticket ${t}`);
        assert.equal(draw.view.rule, 'some_rule(n=2)');
      }
      assert.ok(script.counts.length > 2, 'several blocks');
    } finally {
      close();
    }
  });

  it('wakes the waiting calls when the list changed while their lease was asked', async () => {
    const script = new ScriptedLeases();
    const { stream, leases, woken, close } = leaser(script);
    try {
      assert.equal(stream.take().kind, 'wait');
      // The list changes before the answer: that answer is dropped and the lease asked again;
      // the call (picked again by the policy, and waiting) is woken by the second answer.
      leases.invalidate();
      assert.equal(stream.take().kind, 'wait');
      await woken();
      assert.equal(script.requests, 2);
      const taken = stream.take();
      assert.equal(taken.kind, 'ticket');
      assert.equal(taken.kind === 'ticket' && taken.draw.ticket, 16n, 'a ticket of the lease asked after the change');
    } finally {
      close();
    }
  });

  it('follows the new positions after the instance list changed', async () => {
    const script = new ScriptedLeases();
    const { stream, leases, woken, close } = leaser(script);
    try {
      assert.equal(routed(await take(stream, woken)), 'a');
      script.positions = (_, count) => Array.from({ length: count }, () => 1);
      // What the policy does when the resolver hands it a changed instance (another weight).
      leases.invalidate();
      for (let n = 0; n < 20; n++) {
        assert.equal(routed(await take(stream, woken)), 'b');
      }
    } finally {
      close();
    }
  });

  for (const [what, positions, message] of [
    ['one position too few', (_: bigint, count: number) => Array.from({ length: count - 1 }, () => 0), /lease of 16 tickets carries 15 positions/],
    ['no positions', () => [], /lease of 16 tickets carries 0 positions/],
    ['one position too many', (_: bigint, count: number) => Array.from({ length: count + 1 }, () => 0), /carries 17 positions/],
    ['a position past the list', (_: bigint, count: number) => Array.from({ length: count }, (__, i) => (i === 5 ? 2 : 0)), /lease position 5 names position 2 of 2 instances/],
  ] as const) {
    it(`refuses an answer with ${what}, as a refusal by rota`, async () => {
      const script = new ScriptedLeases();
      script.positions = positions;
      const { stream, woken, close } = leaser(script);
      try {
        assert.equal(stream.take().kind, 'wait');
        await woken();
        const taken = stream.take();
        assert.equal(taken.kind, 'error', 'a ticket of an answer the channel cannot use');
        assert.equal(taken.kind === 'error' && taken.code, status.INVALID_ARGUMENT);
        assert.match(taken.kind === 'error' ? taken.details : '', message);
      } finally {
        close();
      }
    });
  }
});

describe("lease stream telling rota the instances it cannot use", () => {
  it('names the unusable ids in every lease, as they are when it is sent', async () => {
    const script = new ScriptedLeases();
    let unusable: string[] = [];
    const { stream, woken, close } = leaser(script, () => undefined, () => unusable);
    try {
      await take(stream, woken);
      assert.deepEqual(script.excludes, [[]]);
      unusable = ['b'];
      const requests = script.requests;
      for (let n = 0; n < 100_000 && script.requests === requests; n++) {
        await take(stream, woken);
      }
      assert.deepEqual(script.excludes.slice(requests), [['b']]);
    } finally {
      close();
    }
  });

  it('sends the first 1000 unusable ids in id order', async () => {
    const script = new ScriptedLeases();
    const many = Array.from({ length: 1_500 }, (_, i) => `x-${String(1_499 - i).padStart(4, '0')}`);
    const { stream, woken, close } = leaser(script, () => undefined, () => many);
    try {
      await take(stream, woken);
      assert.deepEqual(script.excludes[0], [...many].sort().slice(0, 1_000));
      assert.equal(script.excludes[0][0], 'x-0000');
      assert.equal(script.excludes[0].at(-1), 'x-0999');
    } finally {
      close();
    }
  });

  it('leases again without exclude when rota refuses the exclude for leaving it no instance, until the unusable ids change', async () => {
    const script = new ScriptedLeases();
    script.refuseExcluded = true;
    let unusable = ['a', 'b'];
    const { stream, leases, woken, close } = leaser(script, () => undefined, () => unusable);
    try {
      const first = await take(stream, woken);
      assert.equal(first.ticket, 0n, 'the lease without exclude answered the call');
      assert.deepEqual(script.excludes, [['a', 'b'], []]);
      // The next leases go without exclude while the unusable ids stay the same.
      for (let n = 0; n < 100_000 && script.requests < 4; n++) {
        await take(stream, woken);
      }
      assert.deepEqual(script.excludes.slice(2, 4), [[], []]);
      // Others unusable: exclude again.
      unusable = ['a'];
      const requests = script.requests;
      for (let n = 0; n < 100_000 && script.requests === requests; n++) {
        await take(stream, woken);
      }
      assert.deepEqual(script.excludes.slice(requests), [['a']]);
      // The refused set again: refused once more after a change of the instance list.
      unusable = ['a', 'b'];
      leases.invalidate();
      const before = script.requests;
      await take(stream, woken);
      assert.deepEqual(script.excludes.slice(before), [['a', 'b'], []]);
    } finally {
      close();
    }
  });
});

describe('lease stream of a gray lease (picks rota mapped itself)', () => {
  it('hands out the picks in order, with their tickets and instances, and leases the next block ahead', async () => {
    const script = new ScriptedLeases();
    script.gray = true;
    const { stream, woken, close } = leaser(script);
    let taken = 0;
    const requestedAt: number[] = [];
    script.onRequest = () => requestedAt.push(taken);
    try {
      for (let i = 0; i < 200; i++) {
        const draw = await take(stream, woken);
        taken++;
        assert.equal(draw.local, false);
        assert.equal(draw.position, grayPick(i).position, `pick ${i}`);
        assert.equal(draw.ticket, grayPick(i).ticket, `pick ${i}`);
        assert.equal(routed(draw), grayId(i));
      }
    } finally {
      close();
    }
    // The first block is 16 picks; the second is asked for by the take that spends half of it
    // (after 7 picks were handed out), not when it runs out.
    assert.equal(script.counts[0], 16);
    assert.equal(requestedAt[0], 0);
    assert.equal(requestedAt[1], 7, `lease requests after ${requestedAt.join(',')} picks`);
  });

  it('takes either answer shape as it comes, ticket range or picks', async () => {
    const script = new ScriptedLeases();
    const { stream, woken, close } = leaser(script);
    try {
      const first = await take(stream, woken);
      // A ticket of a range has its position and names no block of picks.
      assert.deepEqual([first.ticket, first.position, first.named], [0n, 0, undefined]);
      script.gray = true;
      // The rest of the ticket blocks already held, then the picks.
      let draw = first;
      for (let n = 0; n < 100 && draw.named === undefined; n++) {
        draw = await take(stream, woken);
      }
      assert.notEqual(draw.named, undefined, 'no pick after the service went gray');
      assert.deepEqual({ ticket: draw.ticket, position: draw.position }, grayPick(0));
      script.gray = false;
      for (let n = 0; n < 100 && draw.named !== undefined; n++) {
        draw = await take(stream, woken);
      }
      assert.equal(draw.named, undefined, 'still picks after the gray release ended');
      assert.equal(routed(draw), ['a', 'b'][Number(draw.ticket % 2n)]);
    } finally {
      close();
    }
  });

  it('drops the unused picks when the instance list changes', async () => {
    const script = new ScriptedLeases();
    script.gray = true;
    const { stream, leases, woken, close } = leaser(script);
    try {
      for (let i = 0; i < 3; i++) {
        assert.equal((await take(stream, woken)).ticket, grayPick(i).ticket);
      }
      const served = script.picks;
      leases.invalidate();
      const next = await take(stream, woken);
      // The first pick of a lease asked for after the change: the picks 3.. of the block held
      // are gaps, never used.
      assert.deepEqual({ ticket: next.ticket, position: next.position }, grayPick(served));
      assert.ok(served >= 16);
    } finally {
      close();
    }
  });

  it('refuses an answer whose pick names no instance of it', async () => {
    const script = new ScriptedLeases();
    script.gray = true;
    script.badPosition = true;
    const { stream, woken, close } = leaser(script);
    try {
      assert.equal(stream.take().kind, 'wait');
      await woken();
      const taken = stream.take();
      assert.equal(taken.kind, 'error');
      assert.equal(taken.kind === 'error' && taken.code, status.INVALID_ARGUMENT);
      assert.match(taken.kind === 'error' ? taken.details : '', /position 3 of 3 instances/);
    } finally {
      close();
    }
  });

  it('replays the last block of picks while rota is down, keeping the split', async () => {
    const script = new ScriptedLeases();
    script.gray = true;
    const { stream, woken, close } = leaser(script, () => {
      throw new Error('a gray stream replays its picks, it needs no list of the channel');
    });
    try {
      await take(stream, woken);
      script.down = true;
      const local: Draw[] = [];
      for (let n = 0; n < 10_000 && local.length < 40; n++) {
        const draw = await take(stream, woken);
        if (draw.local) {
          local.push(draw);
        }
      }
      assert.equal(local.length, 40, 'no local rotation while rota is down');
      // The block held when rota went away is the first, of 16 picks: its picks over and over.
      assert.deepEqual(
        local.map(routed),
        local.map((_, n) => grayId(n % 16)),
      );
      assert.deepEqual(
        local.map((d) => d.ticket),
        local.map((_, n) => BigInt(n)),
      );
    } finally {
      close();
    }
  });
});
