// rota's dashboard in headless Chromium: a live server, three registered instances, six
// round-robin picks; the table shows the three instances and the bars move to 2 picks each.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import { createInterface } from 'node:readline';
import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';

const ROTA = process.env.ROTA_BIN;
const OUTPUT = process.env.ROTA_TEST_OUTPUT ?? 'test-output';
/** Upper bound for any single wait in this test. */
const PATIENCE_MS = 15_000;
const SERVICE = 'dash';

assert.ok(ROTA, 'ROTA_BIN must name the rota binary (test.sh sets it)');

const children = [];
const cleanups = [];

after(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
});

/** Starts `rota ARGS...` and resolves with the child and its first `lines` stdout lines. */
function start(args, lines, env = {}) {
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
function stop(child, signal) {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => { child.kill('SIGKILL'); resolve(); }, PATIENCE_MS);
    child.once('exit', () => { clearTimeout(timer); resolve(); });
    child.kill(signal);
  });
}

test('the dashboard lists the instances and its bars follow the picks', async () => {
  const server = await start(['serve', '--listen', '127.0.0.1:0', '--admin-listen', '127.0.0.1:0'], 2);
  cleanups.push(() => stop(server.child, 'SIGTERM'));
  const grpc = server.lines[0].match(/^listening on (127\.0\.0\.1:\d+)$/)?.[1];
  const admin = server.lines[1].match(/^admin on (127\.0\.0\.1:\d+)$/)?.[1];
  assert.ok(grpc && admin, `unexpected first lines: ${server.lines}`);
  const env = { ROTA_SERVER: `http://${grpc}` };

  for (const [id, port] of [['a', 7101], ['b', 7102], ['c', 7103]]) {
    const provider = await start(['register', SERVICE, `127.0.0.1:${port}`, '--id', id], 1, env);
    assert.match(provider.lines[0], new RegExp(`^registered .* in ${SERVICE}`));
    cleanups.push(() => stop(provider.child, 'SIGINT'));
  }

  const profile = mkdtempSync(join(tmpdir(), 'rota-chromium-'));
  cleanups.push(async () => rmSync(profile, { recursive: true, force: true }));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
  cleanups.push(() => browser.close());
  const page = browser.pages()[0] ?? (await browser.newPage());
  await page.goto(`http://${admin}/?service=${SERVICE}`);

  await page.waitForFunction(() => document.querySelectorAll('#instances tr[data-instance-id]').length === 3, null, { timeout: PATIENCE_MS });
  const rows = await page.$$eval('#instances tr[data-instance-id]', (trs) => trs.map((tr) => tr.dataset.instanceId));
  assert.deepEqual(rows.sort(), ['a', 'b', 'c']);
  const picks = () => page.$$eval('#bars [data-instance-id]', (bars) =>
    Object.fromEntries(bars.map((bar) => [bar.dataset.instanceId, Number(bar.dataset.picks)])));
  assert.deepEqual(await picks(), { a: 0, b: 0, c: 0 });

  const { stdout } = await promisify(execFile)(ROTA, ['pick', SERVICE, '-n', '6'], { env: { ...process.env, ...env }, timeout: PATIENCE_MS });
  assert.equal(stdout.trim().split('\n').length, 6, stdout);

  // The next pushed snapshot carries the picks; wait for the bars to change, then read them.
  await page.waitForFunction(
    () => [...document.querySelectorAll('#bars [data-instance-id]')].some((bar) => bar.dataset.picks !== '0'),
    null,
    { timeout: PATIENCE_MS },
  );
  await page.waitForFunction(
    () => [...document.querySelectorAll('#bars [data-instance-id]')].reduce((sum, bar) => sum + Number(bar.dataset.picks), 0) === 6,
    null,
    { timeout: PATIENCE_MS },
  );
  assert.deepEqual(await picks(), { a: 2, b: 2, c: 2 });
  const rules = await page.$$eval('#rule-bars [data-rule]', (bars) =>
    Object.fromEntries(bars.map((bar) => [bar.dataset.rule, Number(bar.dataset.picks)])));
  assert.deepEqual(rules, { round_robin: 6 });

  mkdirSync(OUTPUT, { recursive: true });
  await page.screenshot({ path: join(OUTPUT, 'dashboard.png'), fullPage: true });
});
