// The official JS suite of e2b-dev/code-interpreter (js/tests), run against the SDK published on
// npm rather than the checkout's source: every `../src` (at any depth) the tests import is the
// `@e2b/code-interpreter` package. Otherwise the suite's own settings (its vitest.config.mts):
// the runtime tests (bun, deno) are left out.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  resolve: {
    alias: [{ find: /^(\.\.\/)+src$/, replacement: '@e2b/code-interpreter' }],
  },
  test: {
    include: ['tests/**/*.test.ts'],
    exclude: ['tests/runtimes/**'],
    globals: false,
    // The suite says 30 s; a sandbox with two kernels starting on a loaded 2-core machine
    // takes longer (the whole suite passes with this and one file at a time it does with 30 s).
    testTimeout: 120000,
    environment: 'node',
    maxWorkers: 2,
  },
})
