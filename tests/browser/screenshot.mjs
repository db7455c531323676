// Takes the README's picture of the dashboard: a loopback server, a few services and about a
// minute of known traffic (picks over gRPC at a varying rate, reported latencies, a breaker
// trip, an instance joining and one leaving), then a headless Chromium screenshot, reduced to
// 256 colours when `pngquant` is installed (it keeps the README's picture small).
//
//   ROTA_BIN=target/debug/rota node tests/browser/screenshot.mjs docs/dashboard.png
import { execFileSync } from 'node:child_process';
import { PATIENCE_MS, cleanup, openBrowser, startServer } from './harness.mjs';

const OUT = process.argv[2] ?? 'dashboard.png';
const SECONDS = Number(process.env.SCREENSHOT_SECONDS ?? 75);
const POLICY = '[services.orders]\ngray = { unversioned = 9, versions = { v2 = 1 } }\n';

/** Milliseconds of a call to `id`: a typical latency with some noise. */
const TYPICAL = { 'orders-a': 12, 'orders-b': 24, 'orders-c': 17, 'orders-d': 9, 'orders-v2': 31 };
const noisy = (ms) => ms * (0.8 + 0.4 * Math.random());
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

try {
  const server = await startServer(POLICY);
  const gone = await server.register('inventory', 'inventory-1', 7300);
  await gone();
  await server.register('payments', 'payments-1', 7401);
  await server.register('payments', 'payments-2', 7402);
  const leaving = {};
  for (const [id, port, version] of [['orders-a', 7201], ['orders-b', 7202], ['orders-c', 7203], ['orders-v2', 7209, 'v2']]) {
    leaving[id] = await server.register('orders', id, port, version ? ['--version', version] : []);
  }

  const page = await openBrowser({ width: 1280, height: 900 });
  await page.goto(`http://${server.admin}/?service=orders`);

  const started = Date.now();
  let joined = false;
  let left = false;
  while (Date.now() - started < SECONDS * 1000) {
    const second = (Date.now() - started) / 1000;
    // Traffic swells and ebbs: 4 to 16 picks per 250 ms tick, plus a few developer picks of v2.
    const picks = Math.round(10 + 6 * Math.sin(second / 9));
    for (let i = 0; i < picks; i++) {
      const picked = await server.pickOnce({ service: 'orders' });
      const id = picked.instance.id;
      // orders-c fails for twelve seconds (its breaker opens, and closes on its next
      // success); orders-b slows down later on.
      const failing = id === 'orders-c' && second > 30 && second < 42;
      const slower = id === 'orders-b' && second > 40 ? 1.8 : 1;
      await server.report('orders', id, 1, failing ? 90 : noisy(TYPICAL[id] * slower), !failing);
    }
    if (Math.random() < 0.3) await server.pickOnce({ service: 'orders', version: 'v2' });
    await server.pickOnce({ service: 'payments' });
    if (second > 45 && !joined) {
      leaving['orders-d'] = await server.register('orders', 'orders-d', 7204);
      joined = true;
    }
    if (second > 60 && !left) {
      await leaving['orders-b']();
      left = true;
    }
    await sleep(250);
  }
  await page.waitForFunction(() => document.querySelectorAll('#rate-plot .series').length > 0, null, { timeout: PATIENCE_MS });
  await page.screenshot({ path: OUT, fullPage: true });
  try {
    execFileSync('pngquant', ['--force', '--skip-if-larger', '--output', OUT, '256', '--', OUT]);
  } catch (error) {
    if (error.code !== 'ENOENT' && error.status !== 98 && error.status !== 99) throw error;
  }
  console.log(`wrote ${OUT}`);
} finally {
  await cleanup();
}
