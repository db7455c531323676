// The client and the rota:/// channel against a rota that asks for a token, over plaintext, TLS
// and mTLS: each secured rota holds two echo instances, registered by a client with the token
// (and the client certificate where rota asks for one); consumers then pick and call through
// rota with the token and TLS given as options or in ROTA_TOKEN and ROTA_TLS_*.

import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import { RotaClient, RotaError, type RotaAuthOptions } from '../src/index.js';
import { OPTION_LOGGER, OPTION_TLS_CA, OPTION_TOKEN, rotaChannelOptions } from '../src/channel/index.js';
import { echoCalls, echoPackage, EchoServer, type EchoCall } from './echo.js';
import { silentLogger, type RotaServer } from './harness.js';
import { Certificates, INVALID_TOKEN_MESSAGE, NO_TOKEN_MESSAGE, TOKEN, WRONG_TOKEN, startSecured, type Security } from './secured-rota.js';

const SERVICE = 'echo';
const IDS = ['echo-a', 'echo-b'];
const SECURITIES: Security[] = ['plaintext', 'tls', 'mtls'];
const ENV = ['ROTA_TOKEN', 'ROTA_TLS_CA', 'ROTA_TLS_CERT', 'ROTA_TLS_KEY', 'ROTA_SERVER'] as const;

/** Runs `fn` with the variables of `values` set (the others of ENV unset), restoring them afterwards. */
async function withEnv<T>(values: Partial<Record<(typeof ENV)[number], string>>, fn: () => Promise<T>): Promise<T> {
  const saved = ENV.map((name) => [name, process.env[name]] as const);
  for (const name of ENV) {
    if (values[name] === undefined) {
      Reflect.deleteProperty(process.env, name);
    } else {
      process.env[name] = values[name];
    }
  }
  try {
    return await fn();
  } finally {
    for (const [name, value] of saved) {
      if (value === undefined) {
        Reflect.deleteProperty(process.env, name);
      } else {
        process.env[name] = value;
      }
    }
  }
}

function channel(server: RotaServer, access: RotaAuthOptions, target = `rota://${server.target}/${SERVICE}`): grpc.Client {
  const options = { ...rotaChannelOptions(access), [OPTION_LOGGER]: silentLogger };
  return new (echoPackage().Echo)(target, grpc.credentials.createInsecure(), options);
}

async function instancesCalled(client: grpc.Client, calls = 20): Promise<Set<string>> {
  const results = await echoCalls(client, calls, '', 10_000);
  for (const result of results) {
    assert.equal(result.error, undefined, result.error?.details);
  }
  return new Set(results.map((r) => r.instance ?? ''));
}

async function picked(client: RotaClient, picks = 4): Promise<Set<string>> {
  const ids = new Set<string>();
  for (let i = 0; i < picks; i++) {
    ids.add((await client.pick(SERVICE)).instance.id);
  }
  return ids;
}

describe('a rota with tokens, over plaintext, TLS and mTLS', { timeout: 120_000 }, () => {
  const certs = Certificates.make();
  const log: EchoCall[] = [];
  const echoes: EchoServer[] = [];
  const secured = new Map<Security, { server: RotaServer; provider: RotaClient }>();

  before(async () => {
    for (const id of IDS) {
      echoes.push(await EchoServer.start(id, log));
    }
    for (const security of SECURITIES) {
      const server = await startSecured(certs, security);
      const provider = new RotaClient(server.target, { ...certs.access(security), logger: silentLogger });
      await provider.register(echoes.map((e) => ({ service: SERVICE, host: '127.0.0.1', port: e.port, id: e.id })));
      secured.set(security, { server, provider });
    }
  });

  after(async () => {
    for (const { server, provider } of secured.values()) {
      await provider.close();
      await server.kill(); // not stop(): rota would drain for its grace period first
    }
    for (const echo of echoes) {
      echo.kill();
    }
    rmSync(certs.dir, { recursive: true, force: true });
  });

  const rota = (security: Security): RotaServer => secured.get(security)!.server;

  for (const security of SECURITIES) {
    it(`${security}: the client picks with the token`, async () => {
      const client = new RotaClient(rota(security).target, { ...certs.access(security), logger: silentLogger });
      try {
        assert.deepEqual(await picked(client), new Set(IDS));
      } finally {
        await client.close();
      }
    });

    it(`${security}: the channel routes calls with the token`, async () => {
      const client = channel(rota(security), certs.access(security));
      try {
        assert.deepEqual(await instancesCalled(client), new Set(IDS));
      } finally {
        client.close();
      }
    });
  }

  for (const [token, message] of [
    [WRONG_TOKEN, INVALID_TOKEN_MESSAGE],
    ['', NO_TOKEN_MESSAGE],
  ] as const) {
    it(`a refused token (${JSON.stringify(token)}) fails the client and the channel with rota's status and message`, async () => {
      const access = { ...certs.access('mtls'), token };
      const client = new RotaClient(rota('mtls').target, { ...access, logger: silentLogger });
      try {
        const refusal = await client.pick(SERVICE).then(
          () => assert.fail('the pick was answered'),
          (error: unknown) => error as RotaError,
        );
        assert.ok(refusal instanceof RotaError);
        assert.deepEqual([refusal.code, refusal.details], [grpc.status.UNAUTHENTICATED, message]);
      } finally {
        await client.close();
      }
      const routed = channel(rota('mtls'), access);
      try {
        const [result] = await echoCalls(routed, 1, '', 10_000);
        assert.deepEqual([result!.error?.code, result!.error?.details], [grpc.status.UNAUTHENTICATED, message]);
      } finally {
        routed.close();
      }
    });
  }

  it('the channel takes rota.token and rota.tls_ca as plain string options too', async () => {
    const options = { [OPTION_TOKEN]: TOKEN, [OPTION_TLS_CA]: certs.file('ca.pem'), [OPTION_LOGGER]: silentLogger };
    const client = new (echoPackage().Echo)(`rota://${rota('tls').target}/${SERVICE}`, grpc.credentials.createInsecure(), options);
    try {
      assert.deepEqual(await instancesCalled(client), new Set(IDS));
    } finally {
      client.close();
    }
  });

  it('mTLS refuses a client certificate from another CA', async () => {
    const access = { ...certs.access('mtls'), tlsCert: certs.file('other.pem'), tlsKey: certs.file('other.key') };
    const client = new RotaClient(rota('mtls').target, { ...access, logger: silentLogger });
    try {
      await assert.rejects(client.pick(SERVICE), (error: RotaError) => error.code === grpc.status.UNAVAILABLE && error.unreachable);
    } finally {
      await client.close();
    }
  });

  it('ROTA_TOKEN and ROTA_TLS_* reach rota; an option wins over its variable', async () => {
    const env = {
      ROTA_TOKEN: TOKEN,
      ROTA_TLS_CA: certs.file('ca.pem'),
      ROTA_TLS_CERT: certs.file('client.pem'),
      ROTA_TLS_KEY: certs.file('client.key'),
    };
    await withEnv(env, async () => {
      const client = new RotaClient(rota('mtls').target, { logger: silentLogger });
      try {
        assert.ok(IDS.includes((await client.pick(SERVICE)).instance.id));
      } finally {
        await client.close();
      }
      const wrong = new RotaClient(rota('mtls').target, { token: WRONG_TOKEN, logger: silentLogger });
      try {
        await assert.rejects(wrong.pick(SERVICE), (error: RotaError) => error.code === grpc.status.UNAUTHENTICATED && error.details === INVALID_TOKEN_MESSAGE);
      } finally {
        await wrong.close();
      }
    });
    await withEnv({ ...env, ROTA_SERVER: `https://${rota('mtls').target}` }, async () => {
      const client = channel(rota('mtls'), {}, `rota:///${SERVICE}`);
      try {
        assert.deepEqual(await instancesCalled(client), new Set(IDS));
      } finally {
        client.close();
      }
    });
  });
});
