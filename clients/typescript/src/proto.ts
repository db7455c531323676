// Loads the rota API contract (rota/v1/rota.proto) at run time with @grpc/proto-loader.

import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

import type { ProtoGrpcType } from './generated/rota.js';

const PROTO_FILE = join('rota', 'v1', 'rota.proto');

/**
 * Must match the flags given to proto-loader-gen-types (see package.json), so the generated
 * types describe the objects grpc-js really hands over: camelCase fields, 64-bit integers as
 * numbers, enums as their names, defaults filled in and a virtual field naming the set oneof.
 */
const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: false,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
};

/**
 * The folder holding `rota/v1/rota.proto`: the copy made inside the package at build time
 * (`<package>/proto`), or else the repository's own `proto` folder two levels above the package.
 */
export function findProtoRoot(start: string = dirname(fileURLToPath(import.meta.url))): string {
  for (let dir = start; ; dir = dirname(dir)) {
    const candidate = join(dir, 'proto');
    if (existsSync(join(candidate, PROTO_FILE))) {
      return candidate;
    }
    if (dirname(dir) === dir) {
      throw new Error(`cannot find ${PROTO_FILE} in a "proto" folder above ${start}`);
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
