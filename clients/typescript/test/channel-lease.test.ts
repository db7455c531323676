// The lease stream of the grpc-js channel against a scripted Lease: consecutive tickets, the
// bounded growth of the lease size, and the local rotation while rota is unreachable.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Metadata, status } from '@grpc/grpc-js';

import { Leaser, MAX_LEASE, type Draw, type VersionStream } from '../src/channel/lease.js';
import type { RotaLink } from '../src/channel/link.js';

class ScriptedLeases {
  next = 0n;
  counts: number[] = [];
  down = false;

  link(): RotaLink {
    return {
      service: 'svc',
      backoff: { initialMs: 1, maxMs: 2 },
      logger: { warn() {} },
      offline() {},
      online() {},
      report() {},
      balancer: {
        Lease: (request: { count: number }, _md: Metadata, _opts: object, callback: (e: unknown, r?: unknown) => void) => {
          setImmediate(() => {
            if (this.down) {
              callback(Object.assign(new Error('connection refused'), { code: status.UNAVAILABLE, details: 'connection refused', metadata: new Metadata() }));
              return;
            }
            this.counts.push(request.count);
            const first = this.next;
            this.next += BigInt(request.count);
            callback(null, {
              firstTicket: first.toString(),
              count: request.count,
              rule: 'round_robin',
              instances: [
                { id: 'a', host: '127.0.0.1', port: 1, weight: 100 },
                { id: 'b', host: '127.0.0.1', port: 2, weight: 100 },
              ],
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

function leaser(script: ScriptedLeases): { stream: VersionStream; woken: () => Promise<void>; close: () => void } {
  let wake: (() => void) | undefined;
  const leases = new Leaser(script.link(), '', () => wake?.(), () => undefined);
  const woken = (): Promise<void> =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no wake-up within 10 s')), 10_000);
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  return { stream: leases.stream(''), woken, close: () => leases.close() };
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
      const ids = local.map((d) => d.view.ids[d.view.map.position(d.ticket)!]);
      assert.deepEqual(ids, ids[0] === 'a' ? ['a', 'b', 'a', 'b'] : ['b', 'a', 'b', 'a']);
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
