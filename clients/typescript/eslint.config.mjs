// ESLint over the sources, the tests and the scripts: typescript-eslint's strict type-checked
// rules for the TypeScript (typed through tsconfig.json, which covers src/ and test/), the untyped
// recommended ones for the .mjs files. `npm run lint` runs it; test.sh runs that before the suite,
// after `npm run generate` (the type-checked rules need the types in src/generated/).
import js from '@eslint/js';
import { defineConfig } from 'eslint/config';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default defineConfig(
  // Generated code (`npm run generate`: src/generated/ and the proto copy) and build outputs.
  { ignores: ['src/generated/', 'proto/', 'build/', 'dist/', 'node_modules/'] },
  js.configs.recommended,
  tseslint.configs.strictTypeChecked,
  {
    languageOptions: {
      globals: globals.node,
      parserOptions: {
        projectService: true,
        tsconfigRootDir: import.meta.dirname,
      },
    },
    rules: {
      // node:test's describe() and it() return promises that the runner itself waits for; they
      // need no await at the top of a file or inside describe(). `test` is left out on purpose:
      // the name would also let through a subtest's un-awaited t.test(), which the runner
      // cancels when its parent ends. Every other promise must still be handled.
      '@typescript-eslint/no-floating-promises': [
        'error',
        {
          allowForKnownSafeCalls: [
            { from: 'package', package: 'node:test', name: ['describe', 'it'] },
          ],
        },
      ],
      // A leading underscore marks a parameter kept for its place or to show a handler's shape
      // (`(_error: ServiceError) => {}`, `(_call: { metadata: Metadata }) => ...`).
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrorsIgnorePattern: '^_' },
      ],
      // Counts, ports, milliseconds and flags go into messages as they are; `any`, objects and
      // the like still need an explicit conversion.
      '@typescript-eslint/restrict-template-expressions': [
        'error',
        { allowNumber: true, allowBoolean: true, allowNullish: true },
      ],
      // `() => e.kill()` / `() => resolve()` callbacks whose value nobody reads are the style here.
      '@typescript-eslint/no-confusing-void-expression': ['error', { ignoreArrowShorthand: true }],
      // With noUncheckedIndexedAccess every index read is `T | undefined`; `a[i]!` after a bounds
      // check (the ticket map's arithmetic, the tests' `results[0]!`) is the idiom, and the
      // alternatives are asserts that say nothing more.
      '@typescript-eslint/no-non-null-assertion': 'off',
      // Flags the defensive checks on values that come from the wire or from grpc-js callbacks
      // (`error === null || error === undefined`, `status[code] ?? CODE_n` for an unknown code),
      // whose declared types are narrower than what arrives at run time; removing them would
      // change behaviour.
      '@typescript-eslint/no-unnecessary-condition': 'off',
    },
  },
  {
    files: ['**/*.mjs'],
    extends: [tseslint.configs.disableTypeChecked],
  },
);
