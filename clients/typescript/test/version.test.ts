import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, it } from 'node:test';

import {
  Metadata,
  Server,
  ServerCredentials,
  credentials,
  type sendUnaryData,
  type ServerUnaryCall,
} from '@grpc/grpc-js';

import {
  RotaClient,
  VERSION_HEADER,
  currentVersion,
  propagateVersion,
  versionHeaders,
  versionInterceptor,
  versionMetadata,
  versionMiddleware,
  withCallVersion,
  withVersion,
} from '../src/index.js';
import { pickRequest } from '../src/client.js';
import type { PickRequest__Output } from '../src/generated/rota/v1/PickRequest.js';
import { rotaV1 } from '../src/proto.js';
import { FakeRota } from './fake-rota.js';
import { silentLogger } from './harness.js';

describe('current version', () => {
  it('is set by withVersion for everything the function starts', async () => {
    assert.equal(currentVersion(), undefined);
    const seen = await withVersion('v1', async () => {
      const before = currentVersion();
      await new Promise((resolve) => setTimeout(resolve, 1));
      const afterTimer = currentVersion();
      const inner = withVersion('v2', () => currentVersion());
      const cleared = withVersion('', () => currentVersion());
      const unset = withVersion(undefined, () => currentVersion());
      return [before, afterTimer, inner, cleared, unset, currentVersion()];
    });
    assert.deepEqual(seen, ['v1', 'v1', 'v2', undefined, undefined, 'v1']);
    assert.equal(currentVersion(), undefined);
  });

  it('applies to picks that give no version of their own', () => {
    assert.deepEqual(pickRequest('orders'), {
      service: 'orders',
      rule: '',
      version: '',
      key: '',
      zone: '',
      exclude: [],
    });
    withVersion('zlt', () => {
      assert.equal(pickRequest('orders').version, 'zlt');
      assert.equal(pickRequest('orders', { version: 'bob' }).version, 'bob');
      assert.equal(pickRequest('orders', { version: '' }).version, '');
      assert.deepEqual(pickRequest('orders', { rule: 'repeat(n=2)', key: 'k', zone: 'z', exclude: ['a'] }), {
        service: 'orders',
        rule: 'repeat(n=2)',
        version: 'zlt',
        key: 'k',
        zone: 'z',
        exclude: ['a'],
      });
    });
  });

  it('comes from the x-rota-version header through the HTTP middleware', () => {
    const seen: (string | undefined)[] = [];
    const next = () => {
      seen.push(currentVersion());
    };
    versionMiddleware({ headers: { 'x-rota-version': 'v3' } }, {}, next);
    versionMiddleware({ headers: { 'x-rota-version': ' v4 ' } }, {}, next);
    versionMiddleware({ headers: {} }, {}, next);
    // A request without the header has no version, whatever surrounds the server.
    withVersion('outer', () => versionMiddleware({ headers: {} }, {}, next));
    assert.deepEqual(seen, ['v3', 'v4', undefined, undefined]);
  });

  it('comes from x-rota-version metadata in grpc-js handlers', () => {
    const metadata = new Metadata();
    metadata.set(VERSION_HEADER, 'v5');
    const handler = withCallVersion((call: { metadata: Metadata }, callback: (v: string | undefined) => void) => {
      callback(currentVersion());
      return 'returned';
    });
    let seen: string | undefined = 'not called';
    assert.equal(
      handler({ metadata }, (v) => {
        seen = v;
      }),
      'returned',
    );
    assert.equal(seen, 'v5');
    handler({ metadata: new Metadata() }, (v) => {
      seen = v;
    });
    assert.equal(seen, undefined);

    const service = propagateVersion({
      Get: (_call: { metadata: Metadata }) => currentVersion(),
      label: 'kept',
    });
    assert.equal(service.Get({ metadata }), 'v5');
    assert.equal(service.label, 'kept');
  });

  it('goes out with outgoing HTTP headers and gRPC metadata', () => {
    assert.deepEqual(versionHeaders({ accept: 'text/plain' }), { accept: 'text/plain' });
    withVersion('v6', () => {
      assert.deepEqual(versionHeaders({ accept: 'text/plain' }), { accept: 'text/plain', 'x-rota-version': 'v6' });
      assert.deepEqual(versionMetadata().get(VERSION_HEADER), ['v6']);
      const explicit = new Metadata();
      explicit.set(VERSION_HEADER, 'mine');
      assert.deepEqual(versionMetadata(explicit).get(VERSION_HEADER), ['mine']);
    });
    assert.deepEqual(versionMetadata().get(VERSION_HEADER), []);
  });
});

describe('version propagation across services', () => {
  /** A rota stand-in that records the version of every pick it gets. */
  async function recordingRota(seen: string[]): Promise<FakeRota> {
    return FakeRota.start({
      balancer: {
        Pick(call: ServerUnaryCall<PickRequest__Output, unknown>, callback: sendUnaryData<unknown>) {
          seen.push(call.request.version);
          callback(null, {
            instance: { id: `for-${call.request.version || 'none'}`, service: call.request.service, host: '127.0.0.1', port: 1 },
            rule: 'round_robin',
          });
        },
      },
    });
  }

  it('carries the header of an HTTP request to the picks made while handling it', async () => {
    const seen: string[] = [];
    const rota = await recordingRota(seen);
    const client = new RotaClient(rota.target, { logger: silentLogger });
    const app = createServer((req: IncomingMessage, res: ServerResponse) => {
      versionMiddleware(req, res, () => {
        client.pick('orders').then(
          (result) => res.end(result.instance.id),
          (error: unknown) => {
            res.statusCode = 500;
            res.end(String(error));
          },
        );
      });
    });
    app.listen(0, '127.0.0.1');
    await once(app, 'listening');
    const url = `http://127.0.0.1:${(app.address() as AddressInfo).port}/`;
    try {
      const versioned = await fetch(url, { headers: { 'x-rota-version': 'v3' } });
      assert.equal(await versioned.text(), 'for-v3');
      const plain = await fetch(url);
      assert.equal(await plain.text(), 'for-none');
      assert.deepEqual(seen, ['v3', '']);
    } finally {
      app.close();
      await client.close();
      rota.stop();
    }
  });

  it('carries the version through a gRPC hop: interceptor -> metadata -> handler -> pick', async () => {
    const seen: string[] = [];
    const rota = await recordingRota(seen);
    const downstream = new RotaClient(rota.target, { logger: silentLogger });
    // The "app": a gRPC service whose handler picks from rota.
    const app = new Server();
    const v1 = rotaV1();
    app.addService(
      v1.Balancer.service,
      propagateVersion({
        Pick(call: ServerUnaryCall<PickRequest__Output, unknown>, callback: sendUnaryData<unknown>) {
          downstream.pick(call.request.service).then(
            (result) => callback(null, { instance: { id: result.instance.id, service: 'orders', host: '127.0.0.1', port: 1 } }),
            // pick() rejects with a RotaError.
            (error: unknown) => callback(error as Error),
          );
        },
      }),
    );
    const port = await new Promise<number>((resolve, reject) =>
      app.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (error, bound) => (error ? reject(error) : resolve(bound))),
    );
    const caller = new v1.Balancer(`127.0.0.1:${port}`, credentials.createInsecure(), { interceptors: [versionInterceptor] });
    const call = (version: string | undefined) =>
      withVersion(
        version,
        () =>
          new Promise<string>((resolve, reject) =>
            caller.Pick({ service: 'orders' }, (error, response) => (error ? reject(error) : resolve(response?.instance?.id ?? ''))),
          ),
      );
    try {
      assert.equal(await call('v7'), 'for-v7');
      assert.equal(await call(undefined), 'for-none');
      assert.deepEqual(seen, ['v7', '']);
    } finally {
      caller.close();
      app.forceShutdown();
      await downstream.close();
      rota.stop();
    }
  });
});
