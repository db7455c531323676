// The package as a user gets it: `npm pack` here, the tarball installed into a fresh project
// outside the repository (as README.md's Install section says), and README.md's quick start
// compiled and run there against a live rota.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { RotaClient } from '../src/index.js';
import { EchoServer, type EchoCall } from './echo.js';
import { RotaServer, packageDir, repoRoot, silentLogger } from './harness.js';

const README_TARGET = '127.0.0.1:50051';
const COMMAND_TIMEOUT_MS = 180_000;

/** Runs a command to completion; rejects with its output when it fails or outlives the timeout. */
function run(command: string, args: readonly string[], cwd: string): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(
      command,
      args,
      { cwd, timeout: COMMAND_TIMEOUT_MS, killSignal: 'SIGKILL', maxBuffer: 64 << 20, env: { ...process.env, npm_config_audit: 'false', npm_config_fund: 'false' } },
      (error, stdout, stderr) => {
        if (error !== null) {
          reject(new Error(`${command} ${args.join(' ')} (in ${cwd}): ${error.message}\n${stdout}\n${stderr}`));
        } else {
          resolve(stdout);
        }
      },
    );
  });
}

/** The body of the first ```lang block after `heading` in README.md. */
function readmeBlock(heading: string, lang: string): string {
  const readme = readFileSync(join(packageDir, 'README.md'), 'utf8');
  const section = readme.split(`\n${heading}\n`)[1];
  assert.ok(section !== undefined, `README.md has no "${heading}" heading`);
  const match = new RegExp('^```' + lang + '\\n([\\s\\S]*?)^```$', 'm').exec(section);
  assert.ok(match !== null, `README.md has no \`\`\`${lang} block under "${heading}"`);
  return match[1] as string;
}

/** The version of a dev dependency installed here, so the fresh project uses the same one. */
function installedVersion(name: string): string {
  const manifest = JSON.parse(readFileSync(join(packageDir, 'node_modules', name, 'package.json'), 'utf8')) as { version: string };
  return manifest.version;
}

describe('the packed package, installed as README.md says', { timeout: 600_000 }, () => {
  let scratch: string;
  let project: string;
  let server: RotaServer;

  before(async () => {
    scratch = mkdtempSync(join(tmpdir(), 'rota-ts-install-'));
    server = await RotaServer.start();
  });

  after(async () => {
    await server?.stop();
    if (scratch !== undefined) {
      rmSync(scratch, { recursive: true, force: true });
    }
  });

  it('packs, installs into a fresh project and runs the quick start', async () => {
    // The README's commands: `npm pack` in this folder (its `prepare` script builds dist/ and
    // copies the proto), then `npm install <tarball>` in the user's project.
    const install = readmeBlock('## Install', 'sh');
    assert.match(install, /^npm pack\b/m);
    assert.match(install, /^npm install \/path\/to\/rota\/clients\/typescript\/rota-client-0\.1\.0\.tgz$/m);
    const packed = JSON.parse(await run('npm', ['pack', '--json', '--pack-destination', scratch], packageDir)) as {
      filename: string;
      files: { path: string }[];
    }[];
    const tarball = join(scratch, packed[0]?.filename ?? '');
    assert.equal(packed[0]?.filename, 'rota-client-0.1.0.tgz');
    const shipped = new Set(packed[0]?.files.map((file) => file.path));
    for (const path of ['dist/index.js', 'dist/index.d.ts', 'proto/rota/v1/rota.proto', 'package.json', 'README.md']) {
      assert.ok(shipped.has(path), `the tarball lacks ${path}`);
    }
    assert.ok(![...shipped].some((path) => path.startsWith('src/') || path.startsWith('test/')), 'sources are not shipped');

    project = join(scratch, 'app');
    mkdirSync(project);
    writeFileSync(join(project, 'package.json'), `${JSON.stringify({ name: 'quickstart', private: true, type: 'module' }, null, 2)}\n`);
    writeFileSync(
      join(project, 'tsconfig.json'),
      `${JSON.stringify(
        {
          compilerOptions: {
            target: 'ES2022',
            module: 'NodeNext',
            moduleResolution: 'NodeNext',
            strict: true,
            // The declarations come from checked sources; checking every .d.ts of node_modules
            // again would triple the time of this test.
            skipLibCheck: true,
            types: ['node'],
            outDir: 'out',
          },
          include: ['quickstart.ts'],
        },
        null,
        2,
      )}\n`,
    );
    await run(
      'npm',
      ['install', '--prefer-offline', tarball, `typescript@${installedVersion('typescript')}`, `@types/node@${installedVersion('@types/node')}`],
      project,
    );

    // One source of truth: the proto inside the installed package is the repository's.
    assert.equal(
      readFileSync(join(project, 'node_modules', '@rota', 'client', 'proto', 'rota', 'v1', 'rota.proto'), 'utf8'),
      readFileSync(join(repoRoot, 'proto', 'rota', 'v1', 'rota.proto'), 'utf8'),
      'the proto shipped in the package differs from proto/rota/v1/rota.proto',
    );

    const quickStart = readmeBlock('## Quick start', 'ts');
    assert.ok(quickStart.includes(`'${README_TARGET}'`), `the quick start does not connect to ${README_TARGET}`);
    writeFileSync(join(project, 'quickstart.ts'), quickStart.replace(README_TARGET, server.target));
    await run(join(project, 'node_modules', '.bin', 'tsc'), ['-p', '.'], project);
    const output = await run(process.execPath, [join('out', 'quickstart.js')], project);
    assert.equal(output, 'calling 127.0.0.1:8080 (ticket 0)\n');
  });

  it('runs the gRPC channel example: rota:/// through the installed @rota/client/channel', async () => {
    const log: EchoCall[] = [];
    const echoes = await Promise.all(['orders-a', 'orders-b', 'orders-c'].map((id) => EchoServer.start(id, log)));
    const provider = new RotaClient(server.target, { logger: silentLogger });
    const registration = await provider.register(echoes.map((e) => ({ id: e.id, service: 'orders', host: '127.0.0.1', port: e.port })));
    try {
      copyFileSync(join(repoRoot, 'clients', 'conformance', 'channel', 'echo.proto'), join(project, 'echo.proto'));
      writeFileSync(join(project, 'channel.ts'), readmeBlock('## gRPC channels', 'ts'));
      await run(join(project, 'node_modules', '.bin', 'tsc'), ['--target', 'ES2022', '--module', 'NodeNext', '--moduleResolution', 'NodeNext', '--strict', '--skipLibCheck', '--types', 'node', '--outDir', 'out', 'channel.ts'], project);
      process.env['ROTA_SERVER'] = server.target;
      const output = await run(process.execPath, [join('out', 'channel.js')], project).finally(() => delete process.env['ROTA_SERVER']);
      assert.equal(output, 'orders-a\norders-b\norders-c\n');
    } finally {
      await registration.close();
      await provider.close();
      echoes.forEach((e) => e.kill());
    }
  });
});
