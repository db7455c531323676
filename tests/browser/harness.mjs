// Shared by the dashboard test and the screenshot script: a loopback `rota serve`, providers
// registered with `rota register`, picks with `rota pick`, reports over gRPC, and headless
// Chromium. Every wait has a deadline; every process started here is ended by `cleanup()`.
import { spawn, execFile } from 'node:child_process';
import { createInterface } from 'node:readline';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';
import { chromium } from 'playwright-core';

export const ROTA = process.env.ROTA_BIN;
/** Upper bound for any single wait. */
export const PATIENCE_MS = 15_000;
const PROTO_ROOT = join(dirname(fileURLToPath(import.meta.url)), '../../proto');

const children = [];
const cleanups = [];

/** Ends everything started here, last started first. */
export async function cleanup() {
  for (const step of cleanups.splice(0).reverse()) await step().catch(() => {});
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
}

/** Starts `rota ARGS...` and resolves with the child and its first `lines` stdout lines. */
export function start(args, lines, env = {}) {
  if (!ROTA) throw new Error('ROTA_BIN must name the rota binary (test.sh sets it)');
  return new Promise((resolve, reject) => {
    const child = spawn(ROTA, args, { env: { ...process.env, RUST_LOG: 'warn', ...env }, stdio: ['ignore', 'pipe', 'inherit'] });
    children.push(child);
    const seen = [];
    const timer = setTimeout(() => reject(new Error(`rota ${args.join(' ')}: no output in time (${seen})`)), PATIENCE_MS);
    child.once('exit', (code) => reject(new Error(`rota ${args.join(' ')} exited with ${code} after ${seen.length} lines`)));
    createInterface({ input: child.stdout }).on('line', (line) => {
      seen.push(line);
      if (seen.length === lines) {
        clearTimeout(timer);
        resolve({ child, lines: seen });
      }
    });
  });
}

/** Signals `child` and waits (bounded) for it to exit. */
export function stop(child, signal) {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => { child.kill('SIGKILL'); resolve(); }, PATIENCE_MS);
    child.once('exit', () => { clearTimeout(timer); resolve(); });
    child.kill(signal);
  });
}

/**
 * A loopback server with an admin listener; `policy` (TOML) is given as its config file and
 * `extra` are more `rota serve` arguments. Resolves with the gRPC and admin addresses and
 * helpers bound to this server.
 */
export async function startServer(policy = '', extra = []) {
  const dir = mkdtempSync(join(tmpdir(), 'rota-dashboard-'));
  cleanups.push(async () => rmSync(dir, { recursive: true, force: true }));
  const config = join(dir, 'rota.toml');
  writeFileSync(config, policy);
  const server = await start([
    'serve', '--config', config, '--listen', '127.0.0.1:0', '--admin-listen', '127.0.0.1:0', '--shutdown-grace', '100ms',
    ...extra,
  ], 2);
  cleanups.push(() => stop(server.child, 'SIGTERM'));
  const grpcAddr = server.lines[0].match(/^listening on (127\.0\.0\.1:\d+)$/)?.[1];
  const admin = server.lines[1].match(/^admin on (127\.0\.0\.1:\d+)$/)?.[1];
  if (!grpcAddr || !admin) throw new Error(`unexpected first lines: ${server.lines}`);
  const env = { ROTA_SERVER: `http://${grpcAddr}` };

  /** Registers one instance and keeps it registered; resolves with a function that withdraws it. */
  async function register(service, id, port, extra = []) {
    const provider = await start(['register', service, `127.0.0.1:${port}`, '--id', id, ...extra], 1, env);
    if (!new RegExp(`^registered .* in ${service}`).test(provider.lines[0])) throw new Error(provider.lines[0]);
    cleanups.push(() => stop(provider.child, 'SIGINT'));
    return () => stop(provider.child, 'SIGINT');
  }

  /** `rota pick SERVICE -n COUNT ARGS...`; resolves with the picked ids (from the lines that
   *  start with a ticket number). */
  async function pick(service, count, extra = []) {
    const { stdout } = await promisify(execFile)(ROTA, ['pick', service, '-n', String(count), ...extra], {
      env: { ...process.env, ...env }, timeout: PATIENCE_MS,
    });
    return stdout.split('\n').map((line) => line.trim().split(/\s+/)).filter(([ticket]) => /^\d+$/.test(ticket)).map(([, id]) => id);
  }

  /** `rota ARGS...` as a client of this server (ROTA_SERVER set); resolves with its stdout. */
  async function run(args) {
    const { stdout } = await promisify(execFile)(ROTA, args, { env: { ...process.env, ...env }, timeout: PATIENCE_MS });
    return stdout;
  }

  const definition = protoLoader.loadSync('rota/v1/rota.proto', {
    includeDirs: [PROTO_ROOT], keepCase: true, longs: Number, enums: String, defaults: true,
  });
  const proto = grpc.loadPackageDefinition(definition).rota.v1;
  const balancer = new proto.Balancer(grpcAddr, grpc.credentials.createInsecure());
  cleanups.push(async () => balancer.close());

  /** One `Balancer.Pick` over gRPC; resolves with the response. */
  function pickOnce(request) {
    return new Promise((resolve, reject) => {
      balancer.Pick(request, { deadline: Date.now() + PATIENCE_MS }, (error, response) => {
        if (error) reject(error);
        else resolve(response);
      });
    });
  }

  /** Reports `count` calls to `id` taking `ms` each, `ok` or failed. */
  function report(service, id, count, ms, ok = true) {
    const outcome = {
      service, instance_id: id, latency_us: Math.round(ms * 1000),
      result: ok ? 'CALL_RESULT_OK' : 'CALL_RESULT_ERROR',
    };
    return new Promise((resolve, reject) => {
      balancer.Report({ outcomes: Array(count).fill(outcome) }, { deadline: Date.now() + PATIENCE_MS }, (error, response) => {
        if (error) reject(error);
        else resolve(response);
      });
    });
  }

  return { admin, grpc: grpcAddr, register, pick, pickOnce, report, run };
}

/** Headless Chromium (Debian's package) with a throw-away profile; resolves with a page. */
export async function openBrowser(viewport = { width: 1280, height: 900 }) {
  const profile = mkdtempSync(join(tmpdir(), 'rota-chromium-'));
  cleanups.push(async () => rmSync(profile, { recursive: true, force: true }));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    viewport,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
  cleanups.push(() => browser.close());
  return browser.pages()[0] ?? (await browser.newPage());
}
