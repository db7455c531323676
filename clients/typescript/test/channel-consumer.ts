// A consumer process for the channel scenarios: a rota channel of its own, N calls, one line
// per call ("ok ID" or "fail CODE MESSAGE"). Arguments: target rule calls version deadlineMs.

import * as grpc from '@grpc/grpc-js';

import { OPTION_LOGGER, OPTION_RULE, OPTION_TICKET_HEADER } from '../src/channel/index.js';
import { echoCalls, echoPackage } from './echo.js';

const [target = '', rule = '', calls = '0', version = '', deadlineMs = '5000'] = process.argv.slice(2);
const client = new (echoPackage().Echo)(target, grpc.credentials.createInsecure(), {
  [OPTION_RULE]: rule,
  [OPTION_TICKET_HEADER]: true,
  [OPTION_LOGGER]: { warn: (m: string) => console.error(m) },
}) as grpc.Client;
const results = await echoCalls(client, Number(calls), version, Number(deadlineMs));
for (const r of results) {
  process.stdout.write(r.error !== undefined ? `fail ${grpc.status[r.error.code]} ${r.error.details}\n` : `ok ${r.instance}\n`);
}
client.close();
