// A rota that asks for a token, over plaintext, TLS and mTLS, with certificates made for the run
// by scripts/make-test-certs.sh (openssl): a CA for rota's certificate (for 127.0.0.1), a second
// CA rota trusts for client certificates, a client certificate it signed, and one from a CA rota
// does not trust.

import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import type { RotaAuthOptions } from '../src/index.js';
import { RotaServer, repoRoot } from './harness.js';

/** The token rota accepts (the pick scope and every service's register scope). */
export const TOKEN = 'ts-client-token-0123456789';
/** A token rota does not know. */
export const WRONG_TOKEN = 'ts-unknown-token-0123456789';
/** rota's messages for a call without a token and with one it does not know. */
export const NO_TOKEN_MESSAGE = 'no token: send `authorization: Bearer TOKEN`';
export const INVALID_TOKEN_MESSAGE = 'the token is not valid';

export type Security = 'plaintext' | 'tls' | 'mtls';

export class Certificates {
  constructor(readonly dir: string) {}

  static make(): Certificates {
    const dir = mkdtempSync(join(tmpdir(), 'rota-ts-certs-'));
    execFileSync(join(repoRoot, 'scripts', 'make-test-certs.sh'), [dir], { timeout: 60_000, stdio: 'inherit' });
    return new Certificates(dir);
  }

  file(name: string): string {
    return join(this.dir, name);
  }

  /** The options that reach a rota of `security`: the token, the CA and the client certificate. */
  access(security: Security): RotaAuthOptions {
    return {
      token: TOKEN,
      ...(security === 'plaintext' ? {} : { tlsCa: this.file('ca.pem') }),
      ...(security === 'mtls' ? { tlsCert: this.file('client.pem'), tlsKey: this.file('client.key') } : {}),
    };
  }
}

/** rota with {@link TOKEN} (from a token file), serving plaintext, TLS or mTLS. */
export async function startSecured(certs: Certificates, security: Security): Promise<RotaServer> {
  const tokenFile = certs.file(`${security}.token`);
  writeFileSync(tokenFile, TOKEN);
  const config = certs.file(`${security}.toml`);
  writeFileSync(config, `[[auth.tokens]]\nname = "ts-client"\ntoken_file = "${tokenFile}"\nscopes = ["pick", "register:*"]\n`);
  const args = ['--config', config];
  if (security !== 'plaintext') {
    args.push('--tls-cert', certs.file('server.pem'), '--tls-key', certs.file('server.key'));
  }
  if (security === 'mtls') {
    args.push('--tls-client-ca', certs.file('client-ca.pem'));
  }
  return RotaServer.start({ args });
}
