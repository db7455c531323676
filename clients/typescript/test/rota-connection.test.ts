// How the client and the channel choose their connection to rota (src/rota-connection.ts):
// options over ROTA_TOKEN and ROTA_TLS_*, plaintext or TLS by the address and the CA, and the
// refusals of settings that cannot work; and the typed channel options.

import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import { ChannelToken, OPTION_LOGGER, rotaChannelOptions } from '../src/channel/index.js';
import { rotaConnection } from '../src/rota-connection.js';
import { echoCalls, echoPackage } from './echo.js';
import { closedPort, silentLogger } from './harness.js';

describe('the connection to rota', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rota-ts-connection-'));
  // createSsl keeps the bytes; only a handshake would parse them.
  const pem = join(dir, 'ca.pem');
  writeFileSync(pem, '-----BEGIN CERTIFICATE-----\n');
  after(() => rmSync(dir, { recursive: true, force: true }));

  const secure = (c: { credentials: grpc.ChannelCredentials }): boolean => c.credentials._isSecure();

  it('takes the token option over ROTA_TOKEN; an empty option sends none, an empty variable is unset', () => {
    const env = { ROTA_TOKEN: 'from-the-environment' };
    const sent = (c: { token: string | undefined; interceptors: unknown[] }): [string | undefined, number] => [c.token, c.interceptors.length];
    assert.deepEqual(sent(rotaConnection('h:1', { token: 'from-the-option' }, undefined, env)), ['from-the-option', 1]);
    assert.deepEqual(sent(rotaConnection('h:1', {}, undefined, env)), ['from-the-environment', 1]);
    assert.deepEqual(sent(rotaConnection('h:1', { token: '' }, undefined, env)), [undefined, 0]);
    assert.deepEqual(sent(rotaConnection('h:1', {}, undefined, { ROTA_TOKEN: '' })), [undefined, 0]);
  });

  it('is TLS with a CA or an https:// address, plaintext with http://', () => {
    assert.equal(secure(rotaConnection('h:1', {}, undefined, {})), false);
    assert.equal(secure(rotaConnection('h:1', { tlsCa: pem }, undefined, {})), true);
    assert.equal(secure(rotaConnection('h:1', {}, undefined, { ROTA_TLS_CA: pem })), true);
    const plain = rotaConnection('http://h:1/', {}, undefined, { ROTA_TLS_CA: pem });
    assert.deepEqual([plain.target, secure(plain)], ['h:1', false]);
    const tls = rotaConnection('https://h:1', {}, undefined, { ROTA_TLS_CA: pem });
    assert.deepEqual([tls.target, secure(tls)], ['h:1', true]);
  });

  it('refuses https:// without a CA', () => {
    assert.throws(() => rotaConnection('https://h:1', {}, undefined, {}), /an https:\/\/ server needs tlsCa \(or ROTA_TLS_CA\)/);
  });

  it('refuses a certificate without its key and the other way round, from options or variables', () => {
    const together = /tlsCert and tlsKey go together/;
    assert.throws(() => rotaConnection('h:1', { tlsCa: pem, tlsCert: pem }, undefined, {}), together);
    assert.throws(() => rotaConnection('h:1', { tlsCa: pem, tlsKey: pem }, undefined, {}), together);
    assert.throws(() => rotaConnection('h:1', { tlsCa: pem }, undefined, { ROTA_TLS_CERT: pem }), together);
    assert.throws(() => rotaConnection('h:1', { tlsCa: pem }, undefined, { ROTA_TLS_KEY: pem }), together);
  });

  it('names a TLS file it cannot read', () => {
    const missing = join(dir, 'client.key');
    assert.throws(
      () => rotaConnection('h:1', { tlsCa: pem, tlsCert: pem, tlsKey: missing }, undefined, {}),
      (error: Error) => error.message.startsWith(`rota: cannot read tlsKey ${missing}: ENOENT`),
    );
  });

  it('takes the caller\'s own credentials instead of the TLS settings, not with them', () => {
    const own = grpc.credentials.createSsl();
    const chosen = rotaConnection('h:1', {}, own, { ROTA_TLS_CA: join(dir, 'nowhere'), ROTA_TOKEN: 't' });
    assert.deepEqual([chosen.credentials, chosen.token], [own, 't']);
    assert.throws(() => rotaConnection('h:1', { tlsCa: pem }, own, {}), /either credentials or tlsCa/);
  });

  it('of a channel: typed settings become the rota.* channel options, unset ones left out, the token kept out of JSON', () => {
    const options = rotaChannelOptions({ server: 'h:1', token: 'secret-0123456789', tlsCa: 'ca.pem', tlsCert: 'c.pem', tlsKey: 'c.key', ticketHeader: true });
    const { 'rota.token': token, ...others } = options;
    assert.deepEqual(others, {
      'rota.server': 'h:1',
      'rota.ticket_header': true,
      'rota.tls_ca': 'ca.pem',
      'rota.tls_cert': 'c.pem',
      'rota.tls_key': 'c.key',
    });
    assert.ok(token instanceof ChannelToken);
    assert.equal(token.value, 'secret-0123456789');
    // grpc-js's channel trace prints the options as JSON: the token is not in it.
    assert.equal(JSON.stringify(options).includes('secret'), false);
    assert.deepEqual(rotaChannelOptions({}), {});
  });

  it('of a channel: settings that cannot work fail its calls UNAVAILABLE, naming the option', async () => {
    // Nothing is dialled: the resolver fails before its first Watch.
    const target = `rota://127.0.0.1:${await closedPort()}/svc`;
    const options = { ...rotaChannelOptions({ tlsCa: pem, tlsCert: pem }), [OPTION_LOGGER]: silentLogger };
    const client = new (echoPackage().Echo)(target, grpc.credentials.createInsecure(), options);
    try {
      const [result] = await echoCalls(client, 1, '', 5_000);
      assert.equal(result!.error?.code, grpc.status.UNAVAILABLE);
      assert.match(result!.error?.details ?? '', /tlsCert and tlsKey go together/);
    } finally {
      client.close();
    }
  });
});
