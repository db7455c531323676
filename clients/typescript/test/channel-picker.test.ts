// The rota picker over scripted tickets and stand-in subchannels: a ticket whose instance is
// unusable (not READY, or held out for timeouts) goes, the same ticket, to a usable instance as
// the mapping of docs/channels.md says; three timeouts in a row hold an instance out until its
// hold ends on the picker's clock; with no usable instance a call waits or fails.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Metadata, status } from '@grpc/grpc-js';
import { PickResultType, type PickResult, type SubchannelInterface } from '@grpc/grpc-js/build/src/experimental.js';

import { RotaPicker, callStatus, subKey, type PickerOptions, type Usable } from '../src/channel/balancer.js';
import { HOLD_MS, HoldOut } from '../src/channel/holdout.js';
import type { LeaseView, Take } from '../src/channel/lease.js';
import { TicketMap, parseLeasedRule } from '../src/channel/mapping.js';

const IDS = ['a', 'b', 'c'];

function view(rule: string): LeaseView {
  return {
    rule,
    ids: IDS,
    addrs: IDS.map((_, i) => `127.0.0.1:${7000 + i}`),
    weights: IDS.map(() => 100),
    map: new TicketMap(parseLeasedRule(rule), IDS.map(() => 100)),
  };
}

interface Fixture {
  picker: RotaPicker;
  /** Tickets handed out so far. */
  taken: () => bigint;
  /** The instance of a stand-in subchannel. */
  idOf: (s: SubchannelInterface | null) => string;
  holds: Map<string, HoldOut>;
  advance: (ms: number) => void;
}

function fixture(rule: string, ready: readonly string[], more: Partial<PickerOptions> = {}, local = false): Fixture {
  const v = view(rule);
  let next = 0n;
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
    take: (): Take => ({ kind: 'ticket', draw: { ticket: next++, view: v, local } }),
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

describe('rota picker with unusable instances', () => {
  it('sends the ticket of an instance that is not READY to a usable one: the same ticket, shared evenly', () => {
    const f = fixture('round_robin', ['a', 'b']);
    const got: string[] = [];
    for (let t = 0; t < 18; t++) {
      const p = pickOnce(f);
      assert.equal(p.result.pickResultType, PickResultType.COMPLETE);
      assert.equal(p.ticket, String(t), 'the header names the ticket the call was mapped by');
      assert.equal(f.taken(), BigInt(t + 1), 'one ticket per call');
      got.push(p.id);
    }
    assert.equal(got.join(''), 'abaabbabaabbabaabb');
  });

  it('maps the local rotation (rota unreachable) the same way', () => {
    const f = fixture('round_robin', ['a', 'b'], {}, true);
    const got = Array.from({ length: 6 }, (_, n) => {
      const p = pickOnce(f);
      assert.equal(p.ticket, `L${n}`);
      return p.id;
    });
    assert.equal(got.join(''), 'abaabb');
  });

  it('keeps repeat(n=3) runs on one instance', () => {
    const f = fixture('repeat(n=3)', ['b', 'c']);
    const got = Array.from({ length: 18 }, () => pickOnce(f).id).join('');
    assert.equal(got, 'bbbbbbccccccbbbccc');
  });

  it('holds out an instance after three timeouts in a row, and tries it again when the hold ends', () => {
    const f = fixture('round_robin', ['a', 'b', 'c']);
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
    // Held out: c's tickets go to a and b in turn, one ticket per call.
    const held = Array.from({ length: 12 }, () => {
      const p = pickOnce(f);
      ended(p, status.OK);
      return p.id;
    }).join('');
    assert.equal(held, 'abbabaabbaba');
    assert.equal(f.taken(), 21n);
    f.advance(HOLD_MS);
    // The hold ended: the next ticket of c goes to c (ticket 23).
    assert.deepEqual(
      Array.from({ length: 3 }, () => pickOnce(f).id),
      ['a', 'b', 'c'],
    );
  });

  it('waits while an instance connects, else fails, when no instance is usable', () => {
    const none = fixture('round_robin', []);
    const failed = pickOnce(none).result;
    assert.equal(failed.pickResultType, PickResultType.TRANSIENT_FAILURE);
    assert.equal(failed.status?.code, status.UNAVAILABLE);
    assert.match(failed.status?.details ?? '', /no instance of "svc" is reachable/);
    assert.equal(pickOnce(fixture('round_robin', [], { connecting: true })).result.pickResultType, PickResultType.QUEUE);
    // Every READY instance held out counts as none usable.
    const f = fixture('round_robin', ['a']);
    for (let n = 0; n < 3; n++) {
      f.holds.get('a')!.ended(f.holds.get('a')!.generation, status.DEADLINE_EXCEEDED);
    }
    assert.equal(pickOnce(f).result.pickResultType, PickResultType.TRANSIENT_FAILURE);
  });
});
