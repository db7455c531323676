// Test harness: starts `rota serve` processes on free loopback ports and waits on conditions.

import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import type { Logger } from '../src/index.js';

function findPackageDir(): string {
  for (let dir = dirname(fileURLToPath(import.meta.url)); ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'test.sh'))) {
      return dir;
    }
    if (dirname(dir) === dir) {
      throw new Error('cannot find the package folder');
    }
  }
}

export const packageDir = findPackageDir();
export const repoRoot = join(packageDir, '..', '..');

let binary: string | undefined;

/** `$ROTA_BIN`, or else `target/debug/rota` after `cargo build --bin rota` in the repository. */
export function rotaBinary(): string {
  if (binary === undefined) {
    const fromEnv = process.env['ROTA_BIN'];
    if (fromEnv !== undefined && fromEnv !== '') {
      binary = fromEnv;
    } else {
      execFileSync('cargo', ['build', '--bin', 'rota'], { cwd: repoRoot, stdio: ['ignore', 2, 2] });
      binary = join(repoRoot, 'target', 'debug', 'rota');
    }
  }
  return binary;
}

const STARTUP_TIMEOUT_MS = 30_000;
const running = new Set<ChildProcess>();

process.on('exit', () => {
  for (const child of running) {
    child.kill('SIGKILL');
  }
});

/** One `rota serve` process. */
export class RotaServer {
  readonly port: number;
  readonly target: string;
  /** The admin listener's host:port (HTTP), when it was started with `admin: true`. */
  readonly admin: string | undefined;
  readonly #child: ChildProcess;
  readonly #exited: Promise<void>;
  readonly #log: { text: string };

  private constructor(child: ChildProcess, port: number, admin: string | undefined, exited: Promise<void>, log: { text: string }) {
    this.#child = child;
    this.port = port;
    this.target = `127.0.0.1:${port}`;
    this.admin = admin;
    this.#exited = exited;
    this.#log = log;
  }

  /**
   * Starts `rota serve --listen <listen> ...args` with `ROTA_WARMUP=0s` in its environment (a
   * `--warmup` in `args` wins) and reads the bound port from the first line
   * of its output (`listening on 127.0.0.1:PORT`). With `admin: true`, its admin listener is on
   * (`ROTA_ADMIN_LISTEN=127.0.0.1:0`, else off as the environment says) and its address is read
   * from the second line (`admin on 127.0.0.1:PORT`, written with the first).
   */
  static async start(options: { listen?: string; args?: readonly string[]; admin?: boolean } = {}): Promise<RotaServer> {
    const admin = options.admin === true;
    const listen = options.listen ?? '127.0.0.1:0';
    // No start-up warm-up unless a test asks for one (--warmup wins over the variable): a fresh
    // test server has seen no service, and tests expect NOT_FOUND for one never registered.
    const child = spawn(rotaBinary(), ['serve', '--listen', listen, ...(options.args ?? [])], {
      env: { ...process.env, ROTA_WARMUP: '0s', ...(admin ? { ROTA_ADMIN_LISTEN: '127.0.0.1:0' } : {}) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    running.add(child);
    const exited = new Promise<void>((resolve) => {
      child.once('exit', () => {
        running.delete(child);
        resolve();
      });
    });
    const log = { text: '' };
    child.stderr?.setEncoding('utf8');
    child.stderr?.on('data', (chunk: string) => {
      log.text = (log.text + chunk).slice(-20_000);
    });
    const lines = createInterface({ input: child.stdout });
    try {
      // One listener for the address lines: readline emits the lines of one chunk at once.
      const read: string[] = [];
      const want = admin ? 2 : 1;
      const [first, second] = await new Promise<string[]>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`rota serve printed nothing within ${STARTUP_TIMEOUT_MS} ms`)), STARTUP_TIMEOUT_MS);
        lines.on('line', (line) => {
          if (read.length === want) {
            return;
          }
          read.push(line);
          if (read.length === want) {
            clearTimeout(timer);
            resolve(read);
          }
        });
        child.once('exit', (code, signal) => {
          clearTimeout(timer);
          reject(new Error(`rota serve exited (${code ?? signal}) before listening:\n${log.text}`));
        });
        child.once('error', (error) => {
          clearTimeout(timer);
          reject(error);
        });
      });
      const match = /^listening on 127\.0\.0\.1:(\d+)$/.exec(first!.trim());
      if (match === null) {
        throw new Error(`unexpected first line from rota serve: ${JSON.stringify(first)}`);
      }
      const adminMatch = admin ? /^admin on (127\.0\.0\.1:\d+)$/.exec(second!.trim()) : null;
      if (admin && adminMatch === null) {
        throw new Error(`unexpected second line from rota serve (want its admin address): ${JSON.stringify(second)}`);
      }
      // The line listener above stays attached, which keeps stdout drained so the process never
      // blocks on a full pipe.
      const server = new RotaServer(child, Number(match[1]), adminMatch?.[1], exited, log);
      return server;
    } catch (error) {
      child.kill('SIGKILL');
      await exited;
      throw error;
    }
  }

  /** How the process ended: its exit code, or the signal that ended it (null while running). */
  get exit(): { code: number | null; signal: NodeJS.Signals | null } {
    return { code: this.#child.exitCode, signal: this.#child.signalCode };
  }

  /** The last lines the server logged (stderr), for failure messages. */
  get log(): string {
    return this.#log.text;
  }

  /** Kills the process with `signal` and waits for it to exit. */
  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    if (this.#child.exitCode === null && this.#child.signalCode === null) {
      this.#child.kill(signal);
    }
    await this.#exited;
  }

  /** Stops the process (SIGTERM, then SIGKILL after 5 s). */
  async stop(): Promise<void> {
    const timer = setTimeout(() => this.#child.kill('SIGKILL'), 5_000);
    await this.kill('SIGTERM');
    clearTimeout(timer);
  }
}

/** Polls `condition` every `intervalMs` until it holds; fails after `timeoutMs`. */
export async function waitFor(
  condition: () => boolean | Promise<boolean>,
  { timeoutMs = 10_000, intervalMs = 20, what = 'condition' }: { timeoutMs?: number; intervalMs?: number; what?: string } = {},
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await condition()) {
      return;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/** Resolves with the arguments of the next `event` of `emitter`; fails after `timeoutMs`. */
export function nextEvent<T extends unknown[]>(
  emitter: { once(event: string, listener: (...args: T) => void): unknown },
  event: string,
  timeoutMs: number,
): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ${event} event within ${timeoutMs} ms`)), timeoutMs);
    emitter.once(event, (...args: T) => {
      clearTimeout(timer);
      resolve(args);
    });
  });
}

/** A logger that keeps what it is told. */
export class CapturingLogger implements Logger {
  readonly lines: string[] = [];
  warn(message: string): void {
    this.lines.push(message);
  }
}

export const silentLogger: Logger = { warn() {} };

/** A loopback port nothing listens on: connections to it are refused. */
export async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  assert.ok(address !== null && typeof address === 'object');
  return address.port;
}
