// The echo service of the channel tests (clients/conformance/channel/echo.proto): each instance
// answers with its own id and records the ticket each call carried in x-rota-ticket.

import { join } from 'node:path';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

import { repoRoot } from './harness.js';

export interface EchoCall {
  instance: string;
  /** The call's x-rota-ticket, or -1n when it carried none. */
  ticket: bigint;
}

interface EchoPackage {
  Echo: grpc.ServiceClientConstructor;
}

let loaded: EchoPackage | undefined;

export function echoPackage(): EchoPackage {
  if (loaded === undefined) {
    const definition = protoLoader.loadSync('echo.proto', {
      includeDirs: [join(repoRoot, 'clients', 'conformance', 'channel')],
      keepCase: false,
      defaults: true,
    });
    loaded = (grpc.loadPackageDefinition(definition) as unknown as { rota: { echo: { v1: EchoPackage } } }).rota.echo.v1;
  }
  return loaded;
}

/** Whether an echo server answers, and the calls it holds unanswered since it hung. */
interface Hang {
  hung: boolean;
  held: (() => void)[];
}

export class EchoServer {
  readonly calls: EchoCall[];
  #server: grpc.Server;
  readonly #hang: Hang;

  private constructor(
    readonly id: string,
    readonly port: number,
    server: grpc.Server,
    calls: EchoCall[],
    hang: Hang,
  ) {
    this.#server = server;
    this.calls = calls;
    this.#hang = hang;
  }

  /**
   * Serves instance `id` on a free 127.0.0.1 port; every call it answers is appended to `log`
   * (the calls it holds unanswered, once hung, are not).
   */
  static async start(id: string, log: EchoCall[]): Promise<EchoServer> {
    const server = new grpc.Server();
    const hang: Hang = { hung: false, held: [] };
    const record = (metadata: grpc.Metadata): void => {
      const value = metadata.get('x-rota-ticket')[0];
      // A local pick's ticket ("L" and the local counter) is not one of the shared rotation.
      log.push({ instance: id, ticket: typeof value === 'string' && !value.startsWith('L') ? BigInt(value) : -1n });
    };
    server.addService(echoPackage().Echo.service, {
      Echo: (call: grpc.ServerUnaryCall<{ message: string }, unknown>, callback: grpc.sendUnaryData<unknown>) => {
        if (hang.hung) {
          // Unanswered until the server is killed; the caller's deadline ends the call first.
          hang.held.push(() => callback({ code: grpc.status.UNAVAILABLE, details: `${id} was stopped` }));
          return;
        }
        record(call.metadata);
        callback(null, { instanceId: id, message: call.request.message });
      },
      EchoStream: (call: grpc.ServerDuplexStream<{ message: string }, unknown>) => {
        if (hang.hung) {
          hang.held.push(() => call.destroy());
          return;
        }
        record(call.metadata);
        call.on('data', (req: { message: string }) => call.write({ instanceId: id, message: req.message }));
        call.on('end', () => call.end());
      },
    });
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (error, p) => (error ? reject(error) : resolve(p))),
    );
    return new EchoServer(id, port, server, log, hang);
  }

  /**
   * From now on the server keeps its connections open but answers nothing, as a stopped
   * (SIGSTOP) process would: every call waits until {@link kill}.
   */
  hang(): void {
    this.#hang.hung = true;
  }

  /** Releases the calls held since the server hung, closes the listener and every connection at once: new connections are refused. */
  kill(): void {
    for (const release of this.#hang.held.splice(0)) {
      release();
    }
    this.#server.forceShutdown();
  }
}

export interface EchoResult {
  instance?: string;
  error?: grpc.ServiceError;
}

/**
 * The x-rota-key of call `i` of a batch with `keys` keys (clients/conformance/xds/README.md):
 * key-(i mod keys), or none when `keys` is 0.
 */
export function keyName(i: number, keys: number): string | undefined {
  return keys > 0 ? `key-${i % keys}` : undefined;
}

/**
 * `n` unary Echo calls on `client`, one after another; `key`, when given, goes in each call's
 * `x-rota-key` metadata (the header rota's xDS routes hash under consistent_hash and sticky).
 */
export async function echoCalls(client: grpc.Client, n: number, version: string, deadlineMs: number, key?: string): Promise<EchoResult[]> {
  const results: EchoResult[] = [];
  const echo = client as unknown as {
    Echo(req: object, md: grpc.Metadata, opts: grpc.CallOptions, cb: (e: grpc.ServiceError | null, r?: { instanceId: string }) => void): void;
  };
  for (let i = 0; i < n; i++) {
    const metadata = new grpc.Metadata();
    if (version !== '') {
      metadata.set('x-rota-version', version);
    }
    if (key !== undefined) {
      metadata.set('x-rota-key', key);
    }
    results.push(
      await new Promise<EchoResult>((resolve) =>
        echo.Echo({ message: String(i) }, metadata, { deadline: Date.now() + deadlineMs }, (error, reply) =>
          resolve(error !== null ? { error } : { instance: reply!.instanceId }),
        ),
      ),
    );
  }
  return results;
}
