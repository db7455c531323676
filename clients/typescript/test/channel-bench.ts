// Compares a rota:///echo channel (the rota policy, leased tickets) with the same channel under
// grpc-js's own round_robin policy, over the same three echo instances, in alternating rounds of
// one run; prints throughput, p99 latency and their ratios.
//
//   npm run pretest && ROTA_BIN=/path/to/rota node build/test/channel-bench.js [rounds] [roundMs] [concurrency]

import * as grpc from '@grpc/grpc-js';

import { RotaClient } from '../src/index.js';
import { OPTION_LOGGER, OPTION_REPORT, OPTION_SERVER } from '../src/channel/index.js';
import { leaseCalls } from '../src/channel/lease.js';
import { EchoServer, echoPackage } from './echo.js';
import { median, round as timedRound, type Echo, type Round } from './bench-round.js';
import { RotaServer, silentLogger } from './harness.js';

const [rounds = 6, roundMs = 2_000, concurrency = 16] = process.argv.slice(2).map(Number);

const round = (client: Echo, ms: number): Promise<Round> => timedRound(client, ms, concurrency);

const server = await RotaServer.start();
const provider = new RotaClient(server.target, { logger: silentLogger });
const echoes = await Promise.all(['echo-a', 'echo-b', 'echo-c'].map((id) => EchoServer.start(id, [])));
const registration = await provider.register(echoes.map((e) => ({ id: e.id, service: 'echo', host: '127.0.0.1', port: e.port })));
const Echo = echoPackage().Echo;
const options = { [OPTION_SERVER]: server.target, [OPTION_LOGGER]: silentLogger };
const rota = new Echo('rota:///echo', grpc.credentials.createInsecure(), options) as unknown as Echo;
const quiet = new Echo('rota:///echo', grpc.credentials.createInsecure(), { ...options, [OPTION_REPORT]: false }) as unknown as Echo;
const rr = new Echo('rota:///echo', grpc.credentials.createInsecure(), {
  ...options,
  'grpc.service_config': JSON.stringify({ loadBalancingConfig: [{ round_robin: {} }] }),
}) as unknown as Echo;
await round(rota, 300);
await round(rr, 300);
await round(quiet, 300);
let rotaCalls = 0;
let rotaLeases = 0;
const a: Round[] = [];
const b: Round[] = [];
const q: Round[] = [];
// The order of the three channels rotates from round to round, so that none always runs first
// (while the process warms up, or the machine's load drifts, the first of a round is at a
// disadvantage).
const runs: (() => Promise<void>)[] = [
  async () => {
    const leasesBefore = leaseCalls.count;
    const r = await round(rota, roundMs);
    rotaLeases += leaseCalls.count - leasesBefore;
    rotaCalls += r.calls;
    a.push(r);
  },
  async () => {
    b.push(await round(rr, roundMs));
  },
  async () => {
    q.push(await round(quiet, roundMs));
  },
];
for (let i = 0; i < rounds; i++) {
  for (let j = 0; j < runs.length; j++) {
    await runs[(i + j) % runs.length]!();
  }
  console.log(
    `round ${i + 1}: rota ${a[i]!.rps.toFixed(0)} rps p99 ${a[i]!.p99.toFixed(0)} µs | round_robin ${b[i]!.rps.toFixed(0)} rps p99 ${b[i]!.p99.toFixed(0)} µs | rota without reports ${q[i]!.rps.toFixed(0)} rps p99 ${q[i]!.p99.toFixed(0)} µs`,
  );
}
const [rq, pq] = [median(q.map((r) => r.rps)), median(q.map((r) => r.p99))];
const [ra, rb] = [median(a.map((r) => r.rps)), median(b.map((r) => r.rps))];
const [pa, pb] = [median(a.map((r) => r.p99)), median(b.map((r) => r.p99))];
console.log(`median: rota ${ra.toFixed(0)} rps, p99 ${pa.toFixed(0)} µs; round_robin ${rb.toFixed(0)} rps, p99 ${pb.toFixed(0)} µs`);
console.log(`median: rota without reports ${rq.toFixed(0)} rps, p99 ${pq.toFixed(0)} µs`);
console.log(`throughput ratio rota/round_robin ${(ra / rb).toFixed(3)}; p99 ratio ${(pa / pb).toFixed(3)}`);
console.log(`RPCs per Lease (rota, reported rounds): ${(rotaCalls / Math.max(rotaLeases, 1)).toFixed(0)} (${rotaCalls} RPCs, ${rotaLeases} leases)`);
console.log(`throughput ratio rota without reports/round_robin ${(rq / rb).toFixed(3)}; p99 ratio ${(pq / pb).toFixed(3)}`);
rota.close();
quiet.close();
rr.close();
await registration.close();
await provider.close();
echoes.forEach((e) => e.kill());
await server.kill();
