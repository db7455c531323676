// How the client and the channel reach rota: plaintext or TLS, with or without a bearer token.
//
// The settings are those of the `rota` command line: an option wins over its environment
// variable (ROTA_TOKEN, ROTA_TLS_CA, ROTA_TLS_CERT, ROTA_TLS_KEY; an empty one counts as unset), a
// client certificate and its key go together, and an `https://` address needs a CA. rota is
// reached over TLS when its address is `https://HOST:PORT`, or a bare `HOST:PORT` with a CA;
// `http://HOST:PORT` is plaintext. The token goes as `authorization: Bearer TOKEN` on every call,
// over TLS and plaintext alike (rota accepts a plaintext connection with tokens).

import { readFileSync } from 'node:fs';

import { InterceptingCall, credentials as grpcCredentials, type ChannelCredentials, type Interceptor } from '@grpc/grpc-js';

export const TOKEN_ENV = 'ROTA_TOKEN';
export const TLS_CA_ENV = 'ROTA_TLS_CA';
export const TLS_CERT_ENV = 'ROTA_TLS_CERT';
export const TLS_KEY_ENV = 'ROTA_TLS_KEY';

/** The token and TLS files of the connection to rota; each defaults to its environment variable. */
export interface RotaAuthOptions {
  /** Bearer token, for a rota with `[auth]` tokens. Default: `ROTA_TOKEN`; `''` sends none. */
  token?: string;
  /** PEM file of the CA that signed rota's certificate; with it rota is reached over TLS. Default: `ROTA_TLS_CA`. */
  tlsCa?: string;
  /** PEM client certificate file, for a rota that requires mTLS (with `tlsKey`). Default: `ROTA_TLS_CERT`. */
  tlsCert?: string;
  /** PEM private key file of `tlsCert`. Default: `ROTA_TLS_KEY`. */
  tlsKey?: string;
}

/** Where and how to reach rota. */
export interface RotaConnection {
  /** The grpc-js target: the address without its scheme. */
  target: string;
  credentials: ChannelCredentials;
  /** The bearer token sent, if any. */
  token: string | undefined;
  /** Add the token to every call (empty without a token). */
  interceptors: Interceptor[];
}

/** The grpc-js target of a rota address: `http://` or `https://` and trailing slashes removed. */
export function bareTarget(address: string): string {
  for (const scheme of ['https://', 'http://']) {
    if (address.startsWith(scheme)) {
      return address.slice(scheme.length).replace(/\/+$/, '');
    }
  }
  return address;
}

/**
 * The connection to rota at `address` (`HOST:PORT`, `http://…` or `https://…`). `credentials` (the
 * caller's own) replaces the TLS options and variables; giving both is an error. Throws an Error
 * naming the option for a lone certificate or key, an `https://` address without a CA, or a TLS
 * file that cannot be read.
 */
export function rotaConnection(
  address: string,
  options: RotaAuthOptions = {},
  credentials?: ChannelCredentials,
  env: NodeJS.ProcessEnv = process.env,
): RotaConnection {
  const chosen = (value: string | undefined, name: string): string | undefined => (value ?? env[name]) || undefined;
  const token = chosen(options.token, TOKEN_ENV);
  const interceptors = token === undefined ? [] : [bearerToken(token)];
  const target = bareTarget(address);
  if (credentials !== undefined) {
    if (options.tlsCa !== undefined || options.tlsCert !== undefined || options.tlsKey !== undefined) {
      throw new Error('rota: give either credentials or tlsCa/tlsCert/tlsKey, not both');
    }
    return { target, credentials, token, interceptors };
  }
  const ca = chosen(options.tlsCa, TLS_CA_ENV);
  const cert = chosen(options.tlsCert, TLS_CERT_ENV);
  const key = chosen(options.tlsKey, TLS_KEY_ENV);
  if ((cert === undefined) !== (key === undefined)) {
    throw new Error(`rota: tlsCert and tlsKey go together (or ${TLS_CERT_ENV} and ${TLS_KEY_ENV})`);
  }
  if (address.startsWith('https://')) {
    if (ca === undefined) {
      throw new Error(`rota: an https:// server needs tlsCa (or ${TLS_CA_ENV})`);
    }
  } else if (address.startsWith('http://') || ca === undefined) {
    return { target, credentials: grpcCredentials.createInsecure(), token, interceptors };
  }
  const tls = grpcCredentials.createSsl(
    read(ca, 'tlsCa'),
    key === undefined ? null : read(key, 'tlsKey'),
    cert === undefined ? null : read(cert, 'tlsCert'),
  );
  return { target, credentials: tls, token, interceptors };
}

function read(path: string, name: string): Buffer {
  try {
    return readFileSync(path);
  } catch (error) {
    throw new Error(`rota: cannot read ${name} ${path}: ${(error as Error).message}`, { cause: error });
  }
}

/** Adds `authorization: Bearer TOKEN` to every call. */
function bearerToken(token: string): Interceptor {
  const value = `Bearer ${token}`;
  return (options, nextCall) =>
    new InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        metadata.set('authorization', value);
        next(metadata, listener);
      },
    });
}
