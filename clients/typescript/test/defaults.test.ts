// Where the client and the channel find rota when told nothing: the target (or the channel's
// authority), then the channel option rota.server, then ROTA_SERVER, then 127.0.0.1:50051, as
// the other clients and the command line do.

import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import { DEFAULT_TARGET, RotaClient, TARGET_ENV } from '../src/index.js';
import { DEFAULT_SERVER, OPTION_LOGGER, OPTION_SERVER, SERVER_ENV, rotaServer } from '../src/channel/index.js';
import { normalizeTarget } from '../src/client.js';
import { echoCalls, echoPackage } from './echo.js';
import { RotaServer, silentLogger } from './harness.js';

/** Runs `fn` with ROTA_SERVER set to `value` (or unset), restoring it afterwards. */
async function withServerEnv<T>(value: string | undefined, fn: () => Promise<T> | T): Promise<T> {
  const saved = process.env.ROTA_SERVER;
  const set = (v: string | undefined): void => {
    if (v === undefined) {
      delete process.env.ROTA_SERVER;
    } else {
      process.env.ROTA_SERVER = v;
    }
  };
  set(value);
  try {
    return await fn();
  } finally {
    set(saved);
  }
}

/** Whether something accepts connections on 127.0.0.1:`port` (one attempt, bounded). */
function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port, timeout: 1_000 });
    const done = (open: boolean): void => {
      socket.destroy();
      resolve(open);
    };
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
    socket.once('timeout', () => done(false));
  });
}

describe('default rota address', () => {
  it('is the same 127.0.0.1:50051 and ROTA_SERVER for the client and the channel', () => {
    assert.equal(DEFAULT_TARGET, '127.0.0.1:50051');
    assert.equal(DEFAULT_SERVER, DEFAULT_TARGET);
    assert.equal(TARGET_ENV, 'ROTA_SERVER');
    assert.equal(SERVER_ENV, TARGET_ENV);
  });

  it('of a channel: authority, then rota.server, then ROTA_SERVER, then 127.0.0.1:50051', () => {
    const env = { [SERVER_ENV]: '127.0.0.1:3' };
    assert.equal(rotaServer('127.0.0.1:1', { [OPTION_SERVER]: '127.0.0.1:2' }, env), '127.0.0.1:1');
    assert.equal(rotaServer('', { [OPTION_SERVER]: '127.0.0.1:2' }, env), '127.0.0.1:2');
    assert.equal(rotaServer('', {}, env), '127.0.0.1:3');
    assert.equal(rotaServer('', { [OPTION_SERVER]: '' }, { [SERVER_ENV]: '' }), '127.0.0.1:50051');
    assert.equal(rotaServer('', {}, {}), '127.0.0.1:50051');
  });

  it('of a client: the target, then ROTA_SERVER, then 127.0.0.1:50051', () => {
    assert.equal(normalizeTarget('http://127.0.0.1:1/', { [TARGET_ENV]: '127.0.0.1:3' }), '127.0.0.1:1');
    assert.equal(normalizeTarget(undefined, { [TARGET_ENV]: 'http://127.0.0.1:3' }), '127.0.0.1:3');
    assert.equal(normalizeTarget('', {}), '127.0.0.1:50051');
    assert.equal(normalizeTarget(undefined, {}), '127.0.0.1:50051');
  });

  it('a client given no target reaches rota at ROTA_SERVER, else names 127.0.0.1:50051', { timeout: 30_000 }, async () => {
    const server = await RotaServer.start();
    try {
      const rota = await withServerEnv(server.target, () => RotaClient.connect(undefined, { logger: silentLogger }));
      try {
        assert.equal(rota.target, server.target);
        assert.deepEqual((await rota.listServices()).map((s) => s.name), []);
      } finally {
        await rota.close();
      }
      const unset = await withServerEnv(undefined, () => new RotaClient());
      assert.equal(unset.target, '127.0.0.1:50051');
      await unset.close();
    } finally {
      await server.stop();
    }
  });

  it('a rota:/// channel given no address watches at 127.0.0.1:50051', { timeout: 30_000 }, async (t) => {
    if (await listening(50051)) {
      t.skip('something listens on 127.0.0.1:50051: the refusal this test expects cannot happen');
      return;
    }
    // The resolver reads ROTA_SERVER when the channel first leaves idle: the call is made
    // with the variable unset.
    await withServerEnv(undefined, async () => {
      const client = new (echoPackage().Echo)('rota:///defaults', grpc.credentials.createInsecure(), { [OPTION_LOGGER]: silentLogger }) as grpc.Client;
      try {
        const [result] = await echoCalls(client, 1, '', 5_000);
        assert.equal(result!.error?.code, grpc.status.UNAVAILABLE);
        assert.match(result!.error.details, /cannot watch service "defaults" at 127\.0\.0\.1:50051/);
      } finally {
        client.close();
      }
    });
  });
});
