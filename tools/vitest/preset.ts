import { resolve } from "node:path";
import { defaultServerConditions } from "vite";
import type { ViteUserConfig } from "vitest/config";

const root = resolve(import.meta.dirname, "../..");

export interface CrwVitestOptions {
  /** Start (or borrow from DATABASE_URL) one PostgreSQL for the run and migrate a template database. */
  postgres?: boolean;
  /**
   * Test files run at once. Vitest's default on two cores is one; a project whose files are long and mostly
   * wait on child processes runs them side by side, so that it is not the one job left running at the end.
   */
  maxWorkers?: number;
  /**
   * A fresh process per test file (true), or files run one after the other in a worker that keeps its
   * loaded modules (false, the default). Loading and transforming the sources again for every file was
   * about a third of a project's time on two cores; the mutation runs keep the fresh process they were
   * measured with.
   */
  isolate?: boolean;
  /**
   * Run before each test file, in its worker: where a file's scratch directories are removed when its
   * tests end (a helper module loaded once per worker cannot register that for every file itself).
   */
  setupFiles?: string[];
  /**
   * A test's bound (60 s by default): a hang ends as a failure. It is no claim about speed: the suites run
   * side by side on two cores, where a test that takes 12 s alone was seen to take 30.
   */
  testTimeout?: number;
}

/**
 * The one vitest setup every project uses: sources resolved through the `@crw/source` condition (no build
 * needed for unit tests), a JSON report per project in its `.reports/vitest.json` that `.ci/run` sums, and the
 * PostgreSQL harness when a project needs a database.
 */
export function crwVitest(name: string, dir: string, options: CrwVitestOptions = {}): ViteUserConfig {
  const conditions = ["@crw/source", ...defaultServerConditions];
  return {
    root: dir,
    resolve: { conditions },
    ssr: { resolve: { conditions } },
    // Global setup files run in vitest's own environment, which reads neither of the two above.
    environments: { __vitest__: { resolve: { conditions } } },
    test: {
      name,
      include: ["test/**/*.test.ts", "src/**/*.test.ts"],
      // The run's own server home first: the PostgreSQL harness's server then lives in it too, and is
      // stopped before the home is removed (teardowns run in reverse).
      globalSetup: [
        resolve(root, "tools/vitest/serverHome.ts"),
        ...(options.postgres ? [resolve(root, "tools/src/pg/global-setup.ts")] : []),
      ],
      reporters: ["default", "json"],
      outputFile: { json: resolve(dir, ".reports", "vitest.json") },
      pool: "forks",
      isolate: options.isolate ?? false,
      setupFiles: options.setupFiles ?? [],
      ...(options.maxWorkers !== undefined && { maxWorkers: options.maxWorkers }),
      passWithNoTests: true,
      testTimeout: options.testTimeout ?? 60_000,
      hookTimeout: 120_000,
    },
  };
}
