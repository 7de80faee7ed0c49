// @ts-check
/**
 * Mutation testing of crw flow (`npm run mutation`; not part of `npm test`: it takes minutes on 2 cores).
 * Incremental: the result of each mutant is kept in reports/mutation/flow-<module>.incremental.json and reused while
 * neither the mutated code nor the tests that cover it change. Each mutant runs only the tests whose
 * per-test coverage reaches it. The sandbox holds only what flow's tests read (the rest of the repo is
 * left out; node_modules are symlinked). See docs/status/mutation.md.
 * @type {import('@stryker-mutator/api/core').PartialStrykerOptions}
 */
const MODULES = {
  journal: ["packages/flow/src/journal/journal.ts"],
  // the resume table: where a call stands, read from its rows alone
  callFold: ["packages/flow/src/engine/callFold.ts"],
  bind: ["packages/flow/src/engine/bind.ts"],
  // the resume path of a run process: open the journal (cut a torn tail), refuse a mixed backend, refuse an
  // op whose input differs from the journal's
  resume: ["packages/flow/src/engine/flowRun.ts:110-140", "packages/flow/src/engine/flowRun.ts:592-615"],
  harvestTurn: ["packages/flow/src/engine/harvestTurn.ts"],
};

/**
 * One module per run (MUTATION_MODULE, default journal): each run keeps its own incremental file and
 * report, so a module that is done stays done when a later run is stopped.
 */
const module = process.env.MUTATION_MODULE ?? "journal";
const mutate = MODULES[/** @type {keyof typeof MODULES} */ (module)];
if (!mutate) throw new Error(`MUTATION_MODULE=${module}: not one of ${Object.keys(MODULES).join(", ")}`);
const out = `reports/mutation/flow-${module}`;

export default {
  testRunner: "vitest",
  plugins: ["@stryker-mutator/vitest-runner"],
  vitest: {
    configFile: "packages/flow/vitest.stryker.config.ts",
    dir: "packages/flow",
    related: true,
  },
  coverageAnalysis: "perTest",
  mutate,
  ignorePatterns: [
    "/*",
    "!/package.json",
    "!/tsconfig.base.json",
    "!/tools",
    "!/packages",
    "/packages/*",
    "!/packages/flow",
    "/packages/flow/dist",
    "/packages/flow/.reports",
  ],
  // a static mutant (a module-level constant) reruns every test: too slow on 2 cores; they are reported as ignored
  ignoreStatic: true,
  concurrency: 1,
  timeoutMS: 30_000,
  incremental: true,
  incrementalFile: `${out}.incremental.json`,
  reporters: ["clear-text", "progress", "html", "json"],
  htmlReporter: { fileName: `${out}.html` },
  jsonReporter: { fileName: `${out}.json` },
  clearTextReporter: { allowColor: false, logTests: false, reportScoreTable: true },
  tempDirName: "reports/mutation/.stryker-tmp",
  cleanTempDir: true,
};
