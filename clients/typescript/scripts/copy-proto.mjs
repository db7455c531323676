// Copies the rota API contract into the package, so the published package loads its own copy.
import { cpSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const packageDir = dirname(dirname(fileURLToPath(import.meta.url)));
const source = join(packageDir, '..', '..', 'proto', 'rota', 'v1', 'rota.proto');
const target = join(packageDir, 'proto', 'rota', 'v1', 'rota.proto');
mkdirSync(dirname(target), { recursive: true });
cpSync(source, target);
