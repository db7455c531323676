// The rota picker over scripted tickets and stand-in subchannels: each call goes to the position
// rota mapped its ticket to; when that instance is unusable (not READY, or held out for
// timeouts) the call takes the next ticket, the skipped one a gap, so the usable instances keep
// the rule's shares (round_robin halves, repeat runs whole, weighted proportions); three
// timeouts in a row hold an instance out until its hold ends on the picker's clock; with no
// usable instance a call waits or fails; the local rotation turns over the usable instances.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Metadata, status } from '@grpc/grpc-js';
import { PickResultType, type PickResult, type SubchannelInterface } from '@grpc/grpc-js/build/src/experimental.js';

import { RotaPicker, callStatus, subKey, type PickerOptions, type Usable } from '../src/channel/balancer.js';
import { HOLD_MS, HoldOut } from '../src/channel/holdout.js';
import type { Draw, LeaseView, Take } from '../src/channel/lease.js';
import { oraclePositions } from './oracle.js';

const IDS = ['a', 'b', 'c'];

function view(rule: string): LeaseView {
  return { rule, ids: IDS, addrs: IDS.map((_, i) => `127.0.0.1:${7000 + i}`) };
}

interface Fixture {
  picker: RotaPicker;
  /** Tickets handed out so far. */
  taken: () => number;
  /** The instance of a stand-in subchannel. */
  idOf: (s: SubchannelInterface | null) => string;
  holds: Map<string, HoldOut>;
  advance: (ms: number) => void;
}

/**
 * A picker over the instances of `ready` (READY stand-ins; the others not READY) whose stream
 * hands out `positions[i]` with ticket i (as a lease answer carries them), then asks to wait;
 * `local` draws are of the local rotation (no position).
 */
function fixture(rule: string, ready: readonly string[], positions: readonly number[], more: Partial<PickerOptions> = {}, local = false): Fixture {
  const v = view(rule);
  let next = 0;
  let now = 1_000;
  const clock = (): number => now;
  const holds = new Map<string, HoldOut>();
  const byChannel = new Map<object, string>();
  const entries = new Map<string, Usable>();
  v.ids.forEach((id, i) => {
    const holdOut = new HoldOut(clock);
    holds.set(id, holdOut);
    if (ready.includes(id)) {
      const subchannel = { stand_in: id } as unknown as SubchannelInterface;
      byChannel.set(subchannel, id);
      entries.set(subKey(id, v.addrs[i]!), { subchannel, holdOut });
    }
  });
  const stream = {
    take: (): Take => {
      if (next >= positions.length) {
        return { kind: 'wait' };
      }
      const ticket = BigInt(next);
      const draw: Draw = local ? { ticket, view: v, local } : { ticket, view: v, local, position: positions[next]! };
      next++;
      return { kind: 'ticket', draw };
    },
  };
  const picker = new RotaPicker(
    { stream: () => stream, link: { report: () => {} } },
    { service: 'svc', version: '', report: true, ticketHeader: true, ready: entries, connecting: false, unsettled: false, ...more },
  );
  return {
    picker,
    taken: () => next,
    idOf: (s) => byChannel.get(s as object) ?? 'none',
    holds,
    advance: (ms) => (now += ms),
  };
}

/** One pick: the instance, the x-rota-ticket header it set, and the result. */
function pickOnce(f: Fixture): { id: string; ticket: string | undefined; result: PickResult } {
  const metadata = new Metadata();
  const result = f.picker.pick({ metadata, extraPickInfo: {} });
  const ticket = metadata.get('x-rota-ticket')[0];
  return { id: f.idOf(result.subchannel), ticket: typeof ticket === 'string' ? ticket : undefined, result };
}

/** `calls` picks that must complete: the instances, as letters, and the tickets they carried. */
function picks(f: Fixture, calls: number): { ids: string; tickets: number[] } {
  let ids = '';
  const tickets: number[] = [];
  for (let n = 0; n < calls; n++) {
    const p = pickOnce(f);
    assert.equal(p.result.pickResultType, PickResultType.COMPLETE, `pick ${n}`);
    ids += p.id;
    tickets.push(Number(p.ticket));
  }
  return { ids, tickets };
}

function tally(letters: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const l of letters) {
    out[l] = (out[l] ?? 0) + 1;
  }
  return Object.fromEntries(Object.entries(out).sort(([a], [b]) => (a < b ? -1 : 1)));
}

describe('rota picker failing calls', () => {
  it("fails a call rota's lease refused as UNAVAILABLE with rota's message, not grpc-js's INTERNAL", () => {
    const message = 'version: must be set: service "svc" uses gray release, which assigns versions per pick';
    const refused = {
      take: (): Take => ({ kind: 'error', code: status.INVALID_ARGUMENT, details: message }),
    };
    const picker = new RotaPicker(
      { stream: () => refused, link: { report: () => {} } },
      { service: 'svc', version: '', report: true, ticketHeader: true, ready: new Map(), connecting: false, unsettled: false },
    );
    const result = picker.pick({ metadata: new Metadata(), extraPickInfo: {} });
    assert.equal(result.pickResultType, PickResultType.TRANSIENT_FAILURE);
    assert.deepEqual([result.status?.code, result.status?.details], [status.UNAVAILABLE, message]);
  });

  it('keeps the codes a picker may use', () => {
    for (const code of [status.UNAVAILABLE, status.RESOURCE_EXHAUSTED, status.PERMISSION_DENIED, status.UNAUTHENTICATED]) {
      assert.equal(callStatus(code), code);
    }
    for (const code of [status.NOT_FOUND, status.FAILED_PRECONDITION, status.OUT_OF_RANGE]) {
      assert.equal(callStatus(code), status.UNAVAILABLE);
    }
  });
});

describe('rota picker routing by the positions rota sent', () => {
  it('sends each call to the position of its ticket, whatever the rule string says', () => {
    // Not t mod 3, nor any rule's sequence: the picker must follow it exactly.
    const positions = [2, 2, 0, 1, 0, 2, 1, 1, 0, 2];
    const f = fixture('round_robin', IDS, positions);
    const got = picks(f, positions.length);
    assert.equal(got.ids, positions.map((p) => IDS[p]).join(''));
    assert.deepEqual(got.tickets, positions.map((_, t) => t), 'one ticket per call, in order');
  });
});

describe('rota picker reporting', () => {
  it('reports the ticket a call was sent by and the rule the lease named, whatever it is', () => {
    const v: LeaseView = { rule: 'a_rule_rota_added(k=2)', ids: IDS, addrs: IDS.map((_, i) => `127.0.0.1:${7000 + i}`) };
    const subchannel = { stand_in: 'b' } as unknown as SubchannelInterface;
    const reports: { instanceId: string; ticket: string; rule: string; result: string }[] = [];
    let next = 40n;
    const picker = new RotaPicker(
      {
        // Tickets 40 (a, not READY: passed over) and 41 (b).
        stream: () => ({ take: (): Take => ({ kind: 'ticket', draw: { ticket: next, view: v, local: false, position: Number(next++ - 40n) } }) }),
        link: { report: (o) => reports.push(o as (typeof reports)[number]) },
      },
      { service: 'svc', version: '', report: true, ticketHeader: false, ready: new Map([[subKey('b', v.addrs[1]!), { subchannel, holdOut: new HoldOut() }]]), connecting: false, unsettled: false },
    );
    const result = picker.pick({ metadata: new Metadata(), extraPickInfo: {} });
    assert.equal(result.subchannel, subchannel);
    result.onCallEnded!(status.OK, '', new Metadata());
    assert.deepEqual(
      reports.map((r) => [r.instanceId, r.ticket, r.rule, r.result]),
      [['b', '41', 'a_rule_rota_added(k=2)', 'CALL_RESULT_OK']],
    );
  });
});

describe('rota picker with unusable instances: the next ticket', () => {
  it('round_robin, one of three not READY: its tickets are gaps and the other two get equal calls', () => {
    const f = fixture('round_robin', ['a', 'b'], oraclePositions('round_robin', [1, 1, 1], 0n, 36));
    const got = picks(f, 24);
    assert.equal(got.ids, 'ab'.repeat(12));
    assert.deepEqual(tally(got.ids), { a: 12, b: 12 });
    // The header names the ticket each call was routed by: c's (2, 5, 8, ...) were never sent.
    assert.deepEqual(
      got.tickets,
      Array.from({ length: 24 }, (_, n) => 3 * Math.floor(n / 2) + (n % 2)),
    );
    assert.equal(f.taken(), 35, 'the skipped tickets are consumed');
  });

  it('repeat(n=3): an unusable instance\'s runs are skipped whole, the others\' stay whole', () => {
    for (const down of ['a', 'b', 'c']) {
      const up = IDS.filter((id) => id !== down);
      const f = fixture('repeat(n=3)', up, oraclePositions('repeat(n=3)', [1, 1, 1], 0n, 90));
      const got = picks(f, 36);
      for (let run = 0; run < 36; run += 3) {
        assert.equal(new Set(got.ids.slice(run, run + 3)).size, 1, `${down} down: run at ${run} of ${got.ids}`);
        assert.equal(got.tickets[run]! % 3, 0, `${down} down: a run starts at a multiple of 3`);
      }
      assert.deepEqual(tally(got.ids), { [up[0]!]: 18, [up[1]!]: 18 }, `${down} down: ${got.ids}`);
      assert.equal(got.ids, `${up[0]!.repeat(3)}${up[1]!.repeat(3)}`.repeat(6));
    }
  });

  it('weighted: the usable instances keep their proportions among themselves', () => {
    // 3:1:1 with b down: a and c keep 3:1. 5:3:2 with a down: b and c keep 3:2.
    const cases: [number[], string, Record<string, number>][] = [
      [[3, 1, 1], 'b', { a: 30, c: 10 }],
      [[5, 3, 2], 'a', { b: 30, c: 20 }],
      [[1, 2, 6], 'c', { a: 10, b: 20 }],
    ];
    for (const [weights, down, want] of cases) {
      const calls = Object.values(want).reduce((x, y) => x + y, 0);
      const f = fixture('weighted', IDS.filter((id) => id !== down), oraclePositions('weighted', weights, 0n, 4 * calls));
      const got = picks(f, calls);
      assert.deepEqual(tally(got.ids), want, `${JSON.stringify(weights)}, ${down} down: ${got.ids}`);
      assert.ok(!got.ids.includes(down));
    }
  });

  it('skips a held-out instance the same way', () => {
    const f = fixture('round_robin', IDS, oraclePositions('round_robin', [1, 1, 1], 0n, 60));
    const ended = (p: { result: PickResult }, code: status): void => p.result.onCallEnded!(code, '', new Metadata());
    // Three rounds: c's calls time out, the others answer.
    for (let round = 0; round < 3; round++) {
      for (const want of ['a', 'b', 'c']) {
        const p = pickOnce(f);
        assert.equal(p.id, want);
        ended(p, want === 'c' ? status.DEADLINE_EXCEEDED : status.OK);
      }
    }
    assert.ok(!f.holds.get('c')!.usable());
    // Held out: c's tickets (11, 14, ...) are passed over, a and b alternate.
    const held: string[] = [];
    const tickets: string[] = [];
    for (let n = 0; n < 8; n++) {
      const p = pickOnce(f);
      ended(p, status.OK);
      held.push(p.id);
      tickets.push(p.ticket!);
    }
    assert.equal(held.join(''), 'abababab');
    assert.deepEqual(tickets, ['9', '10', '12', '13', '15', '16', '18', '19']);
    f.advance(HOLD_MS);
    // The hold ended: ticket 20 is c's again.
    assert.deepEqual(
      Array.from({ length: 3 }, () => pickOnce(f).id),
      ['c', 'a', 'b'],
    );
  });

  it('waits for the next lease when the tickets held are all of unusable instances, rather than looping', () => {
    // Every ticket held goes to c, which is not READY; a and b are.
    const f = fixture('round_robin', ['a', 'b'], [2, 2, 2, 2, 2]);
    assert.equal(pickOnce(f).result.pickResultType, PickResultType.QUEUE);
    assert.equal(f.taken(), 5, 'the unusable tickets are spent, then the call waits');
  });

  it('waits while an instance connects, else fails, when no instance of the list is usable, without spending tickets', () => {
    const none = fixture('round_robin', [], [0, 1, 2, 0, 1, 2]);
    const failed = pickOnce(none).result;
    assert.equal(failed.pickResultType, PickResultType.TRANSIENT_FAILURE);
    assert.equal(failed.status?.code, status.UNAVAILABLE);
    assert.match(failed.status?.details ?? '', /no instance of "svc" is reachable/);
    assert.equal(none.taken(), 1);
    assert.equal(pickOnce(fixture('round_robin', [], [0, 1], { connecting: true })).result.pickResultType, PickResultType.QUEUE);
    // Every READY instance held out counts as none usable.
    const f = fixture('round_robin', ['a'], [0, 1, 2]);
    for (let n = 0; n < 3; n++) {
      f.holds.get('a')!.ended(f.holds.get('a')!.generation, status.DEADLINE_EXCEEDED);
    }
    assert.equal(pickOnce(f).result.pickResultType, PickResultType.TRANSIENT_FAILURE);
  });
});

describe('rota picker on the local rotation (rota unreachable)', () => {
  it('turns a local counter over the usable instances in id order, one call each', () => {
    const all = fixture('weighted', IDS, Array.from({ length: 9 }, () => 0), {}, true);
    const got = Array.from({ length: 9 }, (_, n) => {
      const p = pickOnce(all);
      assert.equal(p.ticket, `L${n}`);
      return p.id;
    });
    assert.equal(got.join(''), 'abcabcabc', 'a plain rotation: the weights are not kept');
    const f = fixture('round_robin', ['a', 'c'], Array.from({ length: 6 }, () => 0), {}, true);
    const some = Array.from({ length: 6 }, (_, n) => {
      const p = pickOnce(f);
      assert.equal(p.ticket, `L${n}`);
      return p.id;
    });
    assert.equal(some.join(''), 'acacac');
    assert.equal(pickOnce(fixture('round_robin', [], [0], {}, true)).result.pickResultType, PickResultType.TRANSIENT_FAILURE);
  });
});
