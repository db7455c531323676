// rota's dashboard in headless Chromium against a live loopback server, asserting on what a
// person sees: the service it opens on, the numbers in the table, the percentage labels and
// bar widths, the plots after known traffic (lines read back against their labelled axes), the
// events list, a plain "no instances" for an empty service, and no console error.
//
// Then: a service with a TCP health check (one instance at a closed port, one at a listening
// one, which an operator drains) shows the verdicts, the override and the announced status;
// of two DNS sources, one whose resolver refuses shows in the sources panel as stale, the other
// (a loopback resolver in the test) as up, and its instance with its source's badge.
//
// Known traffic: service `dash` has a, b, c (no version) and d (version v2) with a gray release
// of 3 : 1 for requests without a version; `aaa` (first alphabetically) had one instance that
// left. 8 picks without a version go a, b, d, c twice; 12 picks with version v2 go to d; a and b
// get calls reported at 20 ms and 40 ms, c three failures (its breaker opens).
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { createServer } from 'node:net';
import { createSocket } from 'node:dgram';
import { join } from 'node:path';
import { PATIENCE_MS, cleanup, openBrowser, startServer } from './harness.mjs';

const OUTPUT = process.env.ROTA_TEST_OUTPUT ?? 'test-output';
const POLICY = '[services.dash]\ngray = { unversioned = 3, versions = { v2 = 1 } }\n';

afterEach(cleanup);

/** Waits until `fn` (run in the page) returns true, failing with `what` after the deadline. */
async function until(page, what, fn, arg) {
  try {
    await page.waitForFunction(fn, arg, { timeout: PATIENCE_MS });
  } catch (error) {
    throw new Error(`${what}: not seen within ${PATIENCE_MS} ms (${error.message.split('\n')[0]})`);
  }
}

/** The instance table as shown: one object per row, keyed by the column headings. */
function table(page) {
  return page.$$eval('#instance-table', ([t]) => {
    if (!t || t.hidden) return [];
    const heads = [...t.querySelectorAll('thead th')].map((th) => th.innerText.trim());
    return [...t.querySelectorAll('tbody tr')].map((tr) =>
      Object.fromEntries([...tr.children].map((td, i) => [heads[i], td.innerText.trim()])));
  });
}

/** A bar chart as shown: label, the value text, and the bar's width over its track's. */
function bars(page, selector) {
  return page.$$eval(`${selector} .bar-row`, (rows) => rows.map((row) => ({
    label: row.querySelector('.label').innerText,
    text: row.querySelector('.value').innerText,
    fraction: row.querySelector('.bar').getBoundingClientRect().width / row.querySelector('.bar-track').getBoundingClientRect().width,
  })));
}

/** The legend of a plot: series name → the figure shown next to it. */
function keys(page, selector) {
  return page.$$eval(`${selector} li`, (items) =>
    Object.fromEntries(items.map((li) => [li.querySelector('.name').innerText, li.querySelector('.figure').innerText])));
}

/**
 * One series of a plot read back as a person would: each drawn point's value, from its height
 * between the axis' zero line and its top line and the number printed at the top.
 */
function plotted(page, plot, series) {
  return page.evaluate(([plot, series]) => {
    const svg = document.getElementById(plot);
    const ticks = [...svg.querySelectorAll('.y-tick')].map((g) => ({
      y: Number(g.querySelector('line').getAttribute('y1')),
      value: parseFloat(g.querySelector('text').textContent),
    }));
    const zero = ticks.find((t) => t.value === 0);
    const top = ticks.reduce((a, b) => (b.value > a.value ? b : a));
    const points = [];
    for (const shape of svg.querySelectorAll(`.series[data-series="${series}"] > *`)) {
      if (shape.tagName === 'polyline') {
        for (const pair of shape.getAttribute('points').split(' ')) points.push(pair.split(',').map(Number));
      } else if (shape.tagName === 'circle') {
        points.push([Number(shape.getAttribute('cx')), Number(shape.getAttribute('cy'))]);
      }
    }
    if (points.some(([x, y]) => !Number.isFinite(x) || !Number.isFinite(y))) {
      throw new Error(`${plot}: series ${series} has a coordinate that is not a number: ${JSON.stringify(points)}`);
    }
    points.sort((a, b) => a[0] - b[0]);
    return points.map(([x, y]) => ({ x, value: ((zero.y - y) / (zero.y - top.y)) * top.value }));
  }, [plot, series]);
}

test('the dashboard opens on a service with instances, shows its traffic and plots it', async () => {
  const server = await startServer(POLICY);
  const { admin } = server;

  // `aaa` sorts first but has no instance left.
  const gone = await server.register('aaa', 'gone', 7100);
  await gone();
  for (const [id, port, version] of [['a', 7101], ['b', 7102], ['c', 7103], ['d', 7104, 'v2']]) {
    await server.register('dash', id, port, version ? ['--version', version] : []);
  }

  const page = await openBrowser();
  const problems = [];
  page.on('console', (message) => { if (message.type() === 'error') problems.push(`console: ${message.text()}`); });
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  page.on('response', (response) => { if (response.status() >= 400) problems.push(`${response.status()} ${response.url()}`); });

  // Opened without naming a service, the page picks the first service that has instances.
  await page.goto(`http://${admin}/`);
  await until(page, 'four instance rows', () => document.querySelectorAll('#instances tr').length === 4);
  assert.equal(await page.locator('#service-title').innerText(), 'dash');
  assert.equal(await page.locator('#services li[data-service="aaa"] .count').innerText(), 'no instances');
  assert.equal(await page.locator('#services li[data-service="dash"] .count').innerText(), '4/4 up');
  assert.deepEqual((await table(page)).map((row) => [row.id, row.version, row.status, row['checks · overrides'], row.picks]), [
    ['a', '—', 'UP', '—', '0'], ['b', '—', 'UP', '—', '0'], ['c', '—', 'UP', '—', '0'], ['d', 'v2', 'UP', '—', '0'],
  ]);
  // Without health checks, overrides or sources their column is left out, and without sources
  // the sources panel too.
  assert.equal(await page.locator('#conditions-header').isVisible(), false);
  assert.equal(await page.locator('#instances td.conditions').first().isVisible(), false);
  assert.equal(await page.locator('#sources-panel').isVisible(), false);

  // "in flight" is labelled for what it counts, and explained.
  const heading = page.locator('#in-flight-header');
  assert.equal(await heading.innerText(), 'unreported picks');
  assert.match(await heading.getAttribute('title'), /in-flight timeout/);
  assert.ok(await page.locator('#in-flight-legend').isVisible());
  assert.match(await page.locator('#in-flight-legend').innerText(), /not calls in progress/);
  assert.match(await page.locator('#gray').innerText(), /unversioned 75% · v2 25%/);

  // 8 picks without a version: the gray release sends one in four to v2 (the second of each
  // four, by its schedule), round robin the rest.
  assert.deepEqual(await server.pick('dash', 8), ['a', 'd', 'b', 'c', 'a', 'd', 'b', 'c']);
  await until(page, 'the table showing 8 picks', () =>
    [...document.querySelectorAll('#instances tr td:last-child')].reduce((sum, td) => sum + Number(td.innerText), 0) === 8);
  assert.deepEqual((await table(page)).map((row) => [row.id, row.picks, row['unreported picks']]), [
    ['a', '2', '2'], ['b', '2', '2'], ['c', '2', '2'], ['d', '2', '2'],
  ]);
  for (const bar of await bars(page, '#bars')) {
    assert.equal(bar.text, '2 (25%)', bar.label);
    assert.ok(Math.abs(bar.fraction - 0.25) < 0.01, `${bar.label} is ${bar.fraction} of its track`);
  }

  // 12 picks of version v2 all go to d.
  assert.deepEqual(await server.pick('dash', 12, ['--version', 'v2']), Array(12).fill('d'));
  await until(page, 'the table showing d with 14 picks', () =>
    document.querySelector('#instances tr[data-instance-id="d"] td:last-child')?.innerText === '14');
  const shares = await bars(page, '#bars');
  assert.deepEqual(shares.map((b) => [b.label, b.text]), [['a', '2 (10%)'], ['b', '2 (10%)'], ['c', '2 (10%)'], ['d', '14 (70%)']]);
  for (const bar of shares) {
    const expected = bar.label === 'd' ? 0.7 : 0.1;
    assert.ok(Math.abs(bar.fraction - expected) < 0.01, `${bar.label} is ${bar.fraction} of its track, not ${expected}`);
  }
  assert.deepEqual((await bars(page, '#rule-bars')).map((b) => [b.label, b.text]), [['round_robin', '20 (100%)']]);

  // The picks-per-second plot: every pick is plotted once, and d's line rises above zero.
  await until(page, 'the rate legend counting all 20 picks', () =>
    [...document.querySelectorAll('#rate-keys .figure')].reduce((sum, f) => sum + Number(f.innerText.match(/(\d+) picks? plotted/)?.[1] ?? 0), 0) === 20);
  const rateKeys = await keys(page, '#rate-keys');
  assert.deepEqual(Object.keys(rateKeys), ['a', 'b', 'c', 'd']);
  assert.match(rateKeys.d, /· 14 picks plotted$/);
  assert.match(rateKeys.a, /· 2 picks plotted$/);
  const d = await plotted(page, 'rate-plot', 'd');
  assert.ok(d.length >= 2, `d's line has ${d.length} points`);
  const peak = Math.max(...d.map((p) => p.value));
  assert.ok(peak >= 1, `d's line peaks at ${peak}/s`);
  assert.ok(d.every((p) => p.value >= -1e-6), 'no negative rate');
  const a = await plotted(page, 'rate-plot', 'a');
  assert.ok(Math.max(...a.map((p) => p.value)) > 0, "a's line rose with the first 8 picks");
  assert.ok(Math.max(...a.map((p) => p.value)) < peak, "a's peak stays under d's");

  // The version plot and its shares: 6 unversioned, 14 v2.
  await until(page, 'version shares', () => document.querySelectorAll('#version-bars .bar-row').length === 2
    && document.querySelector('#version-bars .bar-row:last-child .value').innerText === '14 (70%)');
  const versions = await bars(page, '#version-bars');
  assert.deepEqual(versions.map((b) => [b.label, b.text]), [['unversioned', '6 (30%)'], ['v2', '14 (70%)']]);
  assert.ok(Math.abs(versions[0].fraction - 0.3) < 0.01 && Math.abs(versions[1].fraction - 0.7) < 0.01, JSON.stringify(versions));
  assert.ok(Math.max(...(await plotted(page, 'version-plot', 'version:v2')).map((p) => p.value)) >= 1);

  // Reported calls: the latency column and the latency plot show the EWMA rota keeps.
  assert.equal((await server.report('dash', 'a', 5, 20)).accepted, 5);
  assert.equal((await server.report('dash', 'b', 5, 40)).accepted, 5);
  assert.equal((await server.report('dash', 'c', 3, 5, false)).accepted, 3);
  await until(page, 'latencies and the open breaker in the table', () => {
    const cell = (id, n) => document.querySelector(`#instances tr[data-instance-id="${id}"] td:nth-child(${n})`)?.innerText;
    return cell('a', 9) === '20.0 ms' && cell('b', 9) === '40.0 ms' && cell('c', 10) === 'open · ejected';
  });
  assert.deepEqual((await table(page)).map((row) => [row.id, row['unreported picks'], row['latency (EWMA)'], row.breaker]), [
    ['a', '0', '20.0 ms', 'closed'], ['b', '0', '40.0 ms', 'closed'], ['c', '0', '1000.0 ms', 'open · ejected'], ['d', '14', '—', 'closed'],
  ]);
  await until(page, 'the latency legend', () => document.querySelector('#latency-keys [data-series="a"] .figure')?.innerText === '20.0 ms now'
    && document.querySelector('#latency-keys [data-series="b"] .figure')?.innerText === '40.0 ms now');
  assert.equal((await keys(page, '#latency-keys')).d, 'no reports');
  const latencyA = (await plotted(page, 'latency-plot', 'a')).at(-1);
  const latencyB = (await plotted(page, 'latency-plot', 'b')).at(-1);
  assert.ok(Math.abs(latencyA.value - 20) < 0.5, `a is drawn at ${latencyA.value} ms`);
  assert.ok(Math.abs(latencyB.value - 40) < 0.5, `b is drawn at ${latencyB.value} ms`);
  assert.equal((await plotted(page, 'latency-plot', 'd')).length, 0, 'no line for an instance without reports');

  // Breaker trips and registrations: listed, and marked on the plots' time axis.
  await until(page, 'the breaker trip in the events list', () => document.querySelector('#events').innerText.includes('breaker opened: c'));
  const events = await page.$$eval('#events li', (items) => items.map((li) => li.innerText.replace(/^\d\d:\d\d:\d\d\s*\S\s*/, '')));
  assert.deepEqual(events, ['breaker opened: c', 'registered: d', 'registered: c', 'registered: b', 'registered: a']);
  const marks = await page.$$eval('#rate-plot .marker title', (titles) => titles.map((t) => t.textContent));
  assert.ok(marks.some((t) => t.endsWith('breaker opened: c')), marks.join('; '));
  assert.ok(marks.some((t) => t.endsWith('registered: a')), marks.join('; '));

  mkdirSync(OUTPUT, { recursive: true });
  await page.screenshot({ path: join(OUTPUT, 'dashboard.png'), fullPage: true });

  // A reload draws the same history at once: the server keeps it.
  await page.reload();
  await until(page, 'the rate legend after a reload', () =>
    document.querySelector('#rate-keys [data-series="d"] .figure')?.innerText.endsWith('· 14 picks plotted'));

  // An empty service says so plainly, with no empty table.
  await page.locator('#services li[data-service="aaa"]').click();
  await until(page, 'the empty service', () => !document.getElementById('empty-note').hidden
    && document.getElementById('service-title').innerText === 'aaa');
  assert.match(await page.locator('#empty-note').innerText(), /^No instances: aaa has no registered instances right now/);
  assert.equal(await page.locator('#instance-table').isVisible(), false);
  await until(page, "aaa's events", () => document.querySelector('#events').innerText.includes('left: gone'));

  // The page's icon is served; nothing failed or logged an error on the way.
  const icon = await page.request.get(`http://${admin}/favicon.ico`);
  assert.equal(icon.status(), 200);
  assert.equal(icon.headers()['content-type'], 'image/svg+xml');
  assert.deepEqual(problems, []);
});

test('a page opened on a service never registered says so', async () => {
  const server = await startServer();
  await server.register('only', 'x', 7200);
  const page = await openBrowser();
  await page.goto(`http://${server.admin}/?service=nobody`);
  await until(page, 'the note', () => !document.getElementById('empty-note').hidden
    && document.getElementById('empty-note').innerText.startsWith('Not registered'));
  assert.match(await page.locator('#empty-note').innerText(), /nobody has never been registered/);
  assert.equal(await page.locator('#rate-plot .nodata').textContent(), 'No history: the service is not registered.');
});

/** A TCP listener on a loopback port (closed by `cleanup` via the returned function). */
function listen() {
  return new Promise((resolve, reject) => {
    const server = createServer((socket) => socket.destroy());
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve(server));
  });
}

/** A loopback port nothing listens on: bound (TCP or UDP) and closed again. */
async function closedPort(kind) {
  if (kind === 'udp') {
    const socket = createSocket('udp4');
    await new Promise((resolve) => socket.bind(0, '127.0.0.1', resolve));
    const { port } = socket.address();
    await new Promise((resolve) => socket.close(resolve));
    return port;
  }
  const server = await listen();
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

test('health verdicts, operator overrides and announced statuses show in the instance table', async () => {
  const open = await listen();
  try {
    const server = await startServer(
      '[services.checked]\nhealth_check = { kind = "tcp", interval = "200ms", timeout = "200ms", unhealthy_after = 1 }\n');
    await server.register('checked', 'live', open.address().port);
    await server.register('checked', 'dead', await closedPort('tcp'));
    assert.match(await server.run(['instance', 'drain', 'checked', 'live']), /^checked\s+live\s+drain$/m);

    const page = await openBrowser();
    const problems = [];
    page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
    await page.goto(`http://${server.admin}/?service=checked`);
    const row = (id) => `#instances tr[data-instance-id="${id}"]`;
    await until(page, 'the failing check and the drain', () => {
      const at = (id, selector) => document.querySelector(`#instances tr[data-instance-id="${id}"] ${selector}`) !== null;
      return at('dead', '[data-health="failing"]') && at('live', '[data-health="passing"]') && at('live', '[data-operator="drain"]');
    });
    assert.ok(await page.locator('#conditions-header').isVisible());
    const rows = Object.fromEntries((await table(page)).map((r) => [r.id, r]));
    assert.equal(rows.dead.status, 'DOWN (announced UP)');
    assert.equal(rows.dead['checks · overrides'], 'failing');
    assert.equal(rows.live.status, 'DRAINING (announced UP)');
    assert.deepEqual(rows.live['checks · overrides'].split(/\s+/), ['passing', 'drain']);
    assert.match(await page.locator(`${row('dead')} [data-health="failing"]`).getAttribute('title'), /^health check failing: \S/);
    assert.equal(await page.locator(`${row('dead')} td.DOWN`).count(), 1, 'the published status is styled as DOWN');
    assert.match(await page.locator('#summary').innerText(), /^2 instances, 0 UP/);

    // An override of the weight shows as its own badge, beside the drain.
    assert.match(await server.run(['instance', 'weight', 'checked', 'live', '7']), /drain,weight=7$/m);
    await until(page, 'the weight override', () =>
      document.querySelector('#instances tr[data-instance-id="live"] [data-operator="weight=7"]') !== null);
    assert.equal(await page.locator(`${row('live')} td:nth-child(7)`).innerText(), '7');
    assert.equal(await page.locator('#sources-panel').isVisible(), false);
    assert.deepEqual(problems, []);
    mkdirSync(OUTPUT, { recursive: true });
    await page.screenshot({ path: join(OUTPUT, 'dashboard-checks.png') });
  } finally {
    await new Promise((resolve) => open.close(resolve));
  }
});

/**
 * A loopback DNS server over UDP that answers every A question with 127.0.0.1 (TTL 60) and
 * every other question with no records; resolves with the socket.
 */
async function fakeResolver() {
  const socket = createSocket('udp4');
  socket.on('message', (query, peer) => {
    if (query.length < 12) return;
    let end = 12;
    while (end < query.length && query[end] !== 0) end += query[end] + 1;
    end += 5; // the root label, QTYPE and QCLASS
    if (end > query.length) return;
    const isA = query.readUInt16BE(end - 4) === 1;
    const answer = Buffer.from(query.subarray(0, end));
    answer.writeUInt16BE(0x8180, 2); // a response, recursion desired and available, NOERROR
    answer.writeUInt16BE(isA ? 1 : 0, 6);
    answer.writeUInt16BE(0, 8);
    answer.writeUInt16BE(0, 10);
    const record = isA ? Buffer.from([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 127, 0, 0, 1]) : Buffer.alloc(0);
    socket.send(Buffer.concat([answer, record]), peer.port, peer.address);
  });
  await new Promise((resolve) => socket.bind(0, '127.0.0.1', resolve));
  return socket;
}

test('the sources panel marks a source whose registry does not answer stale; a source instance names its source', async () => {
  const resolver = `127.0.0.1:${await closedPort('udp')}`;
  const answering = await fakeResolver();
  try {
    await sources(resolver, `127.0.0.1:${answering.address().port}`);
  } finally {
    await new Promise((resolve) => answering.close(resolve));
  }
});

/** The sources test proper: a stale source at `resolver`, an answering one at `answering`. */
async function sources(resolver, answering) {
  const server = await startServer('', [
    '--source', `dns://nothing.invalid:1?services=ghost&resolver=${resolver}`,
    '--source', `dns://orders.test:7501?name=local&services=orders&resolver=${answering}`,
  ]);
  const page = await openBrowser();
  await page.goto(`http://${server.admin}/?service=orders`);
  await until(page, 'the sources panel', () => !document.getElementById('sources-panel').hidden
    && document.querySelector('#sources tr[data-source="dns"] [data-state]') !== null);
  // The resolver refuses (nothing listens on its port): the panel, polled, shows why.
  await until(page, 'the last error', (resolver) =>
    document.querySelector('#sources tr[data-source="dns"] td:last-child').innerText.includes(`asking ${resolver}`), resolver);
  const shown = await page.$$eval('#sources-table', ([t]) => {
    const heads = [...t.querySelectorAll('thead th')].map((th) => th.innerText.trim());
    return [...t.querySelectorAll('tbody tr')].map((tr) =>
      Object.fromEntries([...tr.children].map((td, i) => [heads[i], td.innerText.trim()])));
  });
  assert.deepEqual(shown.map((s) => s.name), ['dns', 'local']);
  assert.equal(shown[0].name, 'dns');
  assert.equal(shown[0].kind, 'dns');
  assert.equal(shown[0].state, 'stale');
  assert.equal(shown[0].instances, '0');
  assert.equal(shown[0]['held back'], '—');
  assert.match(shown[0]['last error'], /^nothing\.invalid: asking 127\.0\.0\.1:\d+/);
  const badge = page.locator('#sources tr[data-source="dns"] [data-state="stale"]');
  assert.ok(await badge.isVisible());
  // Marked visibly: not the colour of a healthy source's badge.
  const colors = await badge.evaluate((b) => getComputedStyle(b).backgroundColor);
  assert.notEqual(colors, 'rgba(0, 0, 0, 0)');
  assert.match(await page.locator('#sources tr[data-source="dns"] td:first-child').getAttribute('title'), /^dns:\/\/nothing\.invalid:1/);

  // The answering source is up with its one instance, and that instance shows its source.
  await until(page, 'the answering source up', () =>
    document.querySelector('#sources tr[data-source="local"] [data-state="up"]') !== null
    && document.querySelector('#sources tr[data-source="local"] td:nth-child(4)').innerText === '1');
  assert.equal(await page.locator('#sources tr[data-source="local"] td:last-child').innerText(), '—');
  await until(page, 'the source badge', () =>
    document.querySelector('#instances tr[data-instance-id="local:127.0.0.1:7501"] [data-source="local"]') !== null);
  const [row] = await table(page);
  assert.equal(row.id, 'local:127.0.0.1:7501');
  assert.equal(row.status, 'UP');
  assert.equal(row['checks · overrides'], 'local');
  assert.ok(await page.locator('#conditions-header').isVisible());
  // The source's service is there from rota's first sample on: its rate line is drawn from
  // its first reading, every point a number.
  const series = 'local:127.0.0.1:7501';
  await until(page, "the source instance's rate line", (series) =>
    document.querySelectorAll(`#rate-plot .series[data-series="${series}"] polyline`).length > 0, series);
  const line = await plotted(page, 'rate-plot', series);
  assert.ok(line.length >= 2 && line.every((p) => p.value === 0), JSON.stringify(line));
  mkdirSync(OUTPUT, { recursive: true });
  await page.screenshot({ path: join(OUTPUT, 'dashboard-sources.png') });
}
