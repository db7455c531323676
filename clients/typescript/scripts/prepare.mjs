// The `prepare` script: builds dist/ and copies the proto into the package. npm runs it on
// `npm ci` / `npm install` in this folder, on `npm pack`, and when another project installs this
// folder (`npm install /path/to/rota/clients/typescript`). In that last case npm only links the
// folder and has installed none of its dependencies, so the build tools are installed here first.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const packageDir = dirname(dirname(fileURLToPath(import.meta.url)));
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
// The settings of the npm that runs this script (its prefix, its command) are not for the npm
// runs below, which work on this folder alone.
const env = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.toLowerCase().startsWith('npm_')));
// Their output goes to stderr: stdout belongs to the npm command that runs this script (`npm pack
// --json` prints its result there).
const stdio = ['ignore', 2, 2];

const tools = ['typescript', '@grpc/proto-loader'].map((name) => join(packageDir, 'node_modules', name, 'package.json'));
if (!tools.every((path) => existsSync(path))) {
  execFileSync(npm, ['ci', '--ignore-scripts', '--no-audit', '--no-fund'], { cwd: packageDir, env, stdio });
}
execFileSync(npm, ['run', 'build'], { cwd: packageDir, env, stdio });
