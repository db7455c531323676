// Loads the rota API contract (rota/v1/rota.proto) at run time with @grpc/proto-loader.

import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

import type { ProtoGrpcType } from './generated/rota.js';

const PACKAGE_NAME = '@rota/client';
const PROTO_FILE = join('rota', 'v1', 'rota.proto');

/**
 * Must match the flags given to proto-loader-gen-types (see package.json), so the generated
 * types describe the objects grpc-js really hands over: camelCase fields, 64-bit integers as
 * decimal strings (turned into bigints by types.ts, never into lossy numbers), enums as their
 * names, defaults filled in and a virtual field naming the set oneof.
 */
const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: false,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

/**
 * The folder holding `rota/v1/rota.proto`: `proto/` at the root of this package, where the
 * build copies the repository's proto (it ships in the package). The package root is the
 * nearest folder above this module whose package.json names this package.
 */
export function findProtoRoot(start: string = dirname(fileURLToPath(import.meta.url))): string {
  for (let dir = start; ; dir = dirname(dir)) {
    const manifest = join(dir, 'package.json');
    if (existsSync(manifest) && (JSON.parse(readFileSync(manifest, 'utf8')) as { name?: unknown }).name === PACKAGE_NAME) {
      const root = join(dir, 'proto');
      if (!existsSync(join(root, PROTO_FILE))) {
        throw new Error(`${PACKAGE_NAME} is incomplete: ${join(root, PROTO_FILE)} is missing (npm run build copies it)`);
      }
      return root;
    }
    if (dirname(dir) === dir) {
      throw new Error(`cannot find the ${PACKAGE_NAME} package folder above ${start}`);
    }
  }
}

export type RotaV1 = ProtoGrpcType['rota']['v1'];

let loaded: RotaV1 | undefined;

/** The `rota.v1` package: client constructors and message types. Loaded once. */
export function rotaV1(): RotaV1 {
  if (loaded === undefined) {
    const definition = protoLoader.loadSync(PROTO_FILE, { ...LOADER_OPTIONS, includeDirs: [findProtoRoot()] });
    const root = grpc.loadPackageDefinition(definition) as unknown as ProtoGrpcType;
    loaded = root.rota.v1;
  }
  return loaded;
}
