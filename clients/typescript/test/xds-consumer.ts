// The consumer process of the xDS scenarios (xds.test.ts): grpc-js with @grpc/grpc-js-xds
// registered, one channel to xds:///SERVICE (the first argument, default echo) kept for the
// process's life. The xDS client reads its bootstrap from GRPC_XDS_BOOTSTRAP once per process,
// which is why each scenario gets a process of its own.
//
// Reads one request a line on stdin, {"calls": N, "version": "V", "deadline_ms": D}, makes the N
// unary Echo calls one after another (with x-rota-version: V unless V is empty; with "keys": K
// above 0, call i with x-rota-key: key-(i mod K); with "stop_on_failure": true, none after the
// first that fails) and answers with one line: a JSON list of outcomes, {"instance": ID} or
// {"code": N, "details": MESSAGE}. Exits at the end of stdin.

import { createInterface } from 'node:readline';

import * as grpc from '@grpc/grpc-js';
import * as xds from '@grpc/grpc-js-xds';

import { echoCalls, echoPackage, keyName, type EchoResult } from './echo.js';

/** One line of stdin. */
export interface ConsumerRequest {
  calls: number;
  version: string;
  deadline_ms: number;
  keys?: number;
  stop_on_failure?: boolean;
}

/** One call's outcome, in the line that answers a request. */
export type ConsumerOutcome = { instance: string } | { code: number; details: string };

xds.register();
const [service = 'echo'] = process.argv.slice(2);
const client = new (echoPackage().Echo)(`xds:///${service}`, grpc.credentials.createInsecure()) as grpc.Client;
for await (const line of createInterface({ input: process.stdin })) {
  const request = JSON.parse(line) as ConsumerRequest;
  const results: EchoResult[] = [];
  while (results.length < request.calls && !(request.stop_on_failure === true && results.some((r) => r.error !== undefined))) {
    results.push(...(await echoCalls(client, 1, request.version, request.deadline_ms, keyName(results.length, request.keys ?? 0))));
  }
  const outcomes: ConsumerOutcome[] = results.map((r) => (r.error !== undefined ? { code: r.error.code, details: r.error.details } : { instance: r.instance! }));
  process.stdout.write(`${JSON.stringify(outcomes)}\n`);
}
client.close();
// The xDS client keeps its stream to the control plane open after the channel closes.
process.exit(0);
