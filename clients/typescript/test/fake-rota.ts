// An in-process stand-in for rota (grpc-js server on a loopback port) whose answers each test
// scripts, for client logic that a real server cannot be made to show on demand.

import { Server, ServerCredentials, type UntypedServiceImplementation } from '@grpc/grpc-js';

import { rotaV1 } from '../src/proto.js';

export class FakeRota {
  readonly server: Server;
  readonly port: number;
  readonly target: string;

  private constructor(server: Server, port: number) {
    this.server = server;
    this.port = port;
    this.target = `127.0.0.1:${port}`;
  }

  /** Serves the given Balancer and Registry handlers; missing methods answer UNIMPLEMENTED. */
  static async start(
    handlers: { balancer?: UntypedServiceImplementation; registry?: UntypedServiceImplementation },
    port = 0,
  ): Promise<FakeRota> {
    const rota = rotaV1();
    const server = new Server();
    server.addService(rota.Balancer.service, handlers.balancer ?? {});
    server.addService(rota.Registry.service, handlers.registry ?? {});
    const bound = await new Promise<number>((resolve, reject) => {
      server.bindAsync(`127.0.0.1:${port}`, ServerCredentials.createInsecure(), (error, actual) =>
        error === null ? resolve(actual) : reject(error),
      );
    });
    return new FakeRota(server, bound);
  }

  /** Stops at once, cutting every open call and connection. */
  stop(): void {
    this.server.forceShutdown();
  }
}
