// One timed round of unary Echo calls for the channel benchmarks (channel-bench.ts,
// channel-auth-bench.ts): `concurrency` callers, each calling one after another until the round
// ends; throughput and p99 latency.

import type * as grpc from '@grpc/grpc-js';

export type Echo = grpc.Client & { Echo(req: object, cb: (e: grpc.ServiceError | null) => void): void };

export interface Round {
  rps: number;
  /** µs */
  p99: number;
  calls: number;
}

export async function round(client: Echo, ms: number, concurrency: number): Promise<Round> {
  const latencies: number[] = [];
  const start = performance.now();
  const end = start + ms;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < end) {
        const t = performance.now();
        await new Promise<void>((resolve, reject) => client.Echo({ message: 'x' }, (e) => (e ? reject(e) : resolve())));
        latencies.push(performance.now() - t);
      }
    }),
  );
  const elapsed = performance.now() - start;
  latencies.sort((a, b) => a - b);
  return { rps: (latencies.length * 1000) / elapsed, p99: latencies[Math.floor(latencies.length * 0.99)]! * 1000, calls: latencies.length };
}

export const median = (v: number[]): number => [...v].sort((a, b) => a - b)[v.length >> 1]!;
