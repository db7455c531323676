// Compares a rota:///echo channel whose rota asks for a token over TLS with the same channel to
// a plaintext rota without tokens, over the same three echo instances registered in both, in
// alternating rounds of one run; prints throughput, p99 latency and their ratios.
//
//   npm run pretest && ROTA_BIN=/path/to/rota node build/test/channel-auth-bench.js [rounds] [roundMs] [concurrency]

import { rmSync } from 'node:fs';

import * as grpc from '@grpc/grpc-js';

import { RotaClient, type RotaAuthOptions } from '../src/index.js';
import { OPTION_LOGGER, rotaChannelOptions } from '../src/channel/index.js';
import { median, round, type Echo, type Round } from './bench-round.js';
import { EchoServer, echoPackage } from './echo.js';
import { RotaServer, silentLogger } from './harness.js';
import { Certificates, startSecured } from './secured-rota.js';

const [rounds = 6, roundMs = 2_000, concurrency = 16] = process.argv.slice(2).map(Number);

const certs = Certificates.make();
const plain = await RotaServer.start();
const secured = await startSecured(certs, 'tls');
const access: RotaAuthOptions = certs.access('tls');
const echoes = await Promise.all(['echo-a', 'echo-b', 'echo-c'].map((id) => EchoServer.start(id, [])));
const instances = echoes.map((e) => ({ id: e.id, service: 'echo', host: '127.0.0.1', port: e.port }));
const providers = [new RotaClient(plain.target, { token: '', logger: silentLogger }), new RotaClient(secured.target, { ...access, logger: silentLogger })];
const registrations = await Promise.all(providers.map((p) => p.register(instances)));
const EchoClient = echoPackage().Echo;
const channel = (server: RotaServer, auth: RotaAuthOptions): Echo =>
  new EchoClient('rota:///echo', grpc.credentials.createInsecure(), {
    ...rotaChannelOptions({ server: server.target, ...auth }),
    [OPTION_LOGGER]: silentLogger,
  }) as unknown as Echo;
const contenders: [string, Echo, Round[]][] = [
  ['plaintext', channel(plain, { token: '' }), []],
  ['token+TLS', channel(secured, access), []],
];
for (const [, client] of contenders) {
  await round(client, 300, concurrency);
}
for (let i = 0; i < rounds; i++) {
  // The order alternates, so that neither always runs first.
  for (let j = 0; j < contenders.length; j++) {
    const [, client, results] = contenders[(i + j) % contenders.length]!;
    results.push(await round(client, roundMs, concurrency));
  }
  const [p, s] = contenders.map(([, , results]) => results[i]!);
  console.log(
    `round ${i + 1}: plaintext ${p!.rps.toFixed(0)} rps p99 ${p!.p99.toFixed(0)} µs | token+TLS ${s!.rps.toFixed(0)} rps p99 ${s!.p99.toFixed(0)} µs | ratio ${(s!.rps / p!.rps).toFixed(3)}`,
  );
}
const [rp, rs] = contenders.map(([, , results]) => median(results.map((r) => r.rps)));
const [pp, ps] = contenders.map(([, , results]) => median(results.map((r) => r.p99)));
console.log(`median: plaintext ${rp!.toFixed(0)} rps, p99 ${pp!.toFixed(0)} µs; token+TLS ${rs!.toFixed(0)} rps, p99 ${ps!.toFixed(0)} µs`);
console.log(`throughput ratio token+TLS/plaintext ${(rs! / rp!).toFixed(3)}; p99 ratio ${(ps! / pp!).toFixed(3)}`);
for (const [, client] of contenders) {
  client.close();
}
await Promise.all(registrations.map((r) => r.close()));
await Promise.all(providers.map((p) => p.close()));
echoes.forEach((e) => e.kill());
await plain.kill();
await secured.kill();
rmSync(certs.dir, { recursive: true, force: true });
