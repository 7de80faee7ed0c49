// @ts-check
/**
 * Mutation testing of the modules where a silent bug loses or duplicates work (`npm run mutation`; not part of `npm test`: it takes minutes on 2
 * cores). Incremental: the result of each mutant is kept in reports/mutation/<package>-<module>.incremental.json and
 * reused while neither the mutated code nor the tests that cover it change. Each mutant runs only the tests
 * whose per-test coverage reaches it. The sandbox holds only what the package's tests read (the rest of the
 * repo is left out; node_modules are symlinked). See docs/status/mutation.md.
 */

/**
 * dir: the package whose tests run (its vitest.stryker.config.ts); pg: its tests need the template database
 * migrated from the root's migrations/; dist: its built dist/ stays in the sandbox (the subagent package's tests
 * fork the built runner, dist/runner.js, found beside the sandbox's src/).
 * @typedef {{ dir: string; pg?: boolean; dist?: boolean }} Pkg
 * @type {Record<string, Pkg>}
 */
const PACKAGES = {
  flow: { dir: "packages/flow" },
  db: { dir: "packages/db", pg: true },
  brain: { dir: "packages/brain", pg: true },
  subagent: { dir: "packages/subagent", pg: true, dist: true },
  workflow: { dir: "plugins/subagent", pg: true },
};

/** @type {Record<string, { pkg: keyof typeof PACKAGES; mutate: string[] }>} */
const MODULES = {
  journal: { pkg: "flow", mutate: ["packages/flow/src/journal/journal.ts"] },
  // the resume table: where a call stands, read from its rows alone
  callFold: { pkg: "flow", mutate: ["packages/flow/src/engine/callFold.ts"] },
  bind: { pkg: "flow", mutate: ["packages/flow/src/engine/bind.ts"] },
  // the resume path of a run process: open the journal (cut a torn tail), refuse a mixed backend, refuse an
  // op whose input differs from the journal's
  resume: {
    pkg: "flow",
    // executeRun's open and backend check; FlowRun.call's digest check, replay of an ended call and the
    // re-placed workspace of a prepared one
    mutate: [
      "packages/flow/src/engine/executeRun.ts:22-50",
      "packages/flow/src/engine/flowRun.ts:510-521",
      "packages/flow/src/engine/flowRun.ts:524-524",
      "packages/flow/src/engine/flowRun.ts:529-535",
    ],
  },
  // a bound subagent's turn as harvest() reads it from the host: an unreachable host, an interrupt asked
  // for, a completed turn, a failed one (narrowed: the whole file is 328 mutants, the judgement of a lost
  // attempt, lines 61-92, alone about 90; at ≈30 s a mutant here they do not fit)
  harvestTurn: {
    pkg: "flow",
    mutate: ["packages/flow/src/engine/harvestTurn.ts:33-60"],
  },
  // the rest of harvestTurn.ts in two runs that each fit a session: the judgement of a lost attempt (a
  // thread the host lost or a turn that ended without an answer, the clock that waits before it, the
  // attempt lost), then a failed turn's reading, the verdict on an answer (its schema, the repair turn) and
  // the subagent's close
  "harvestTurn-lost": {
    pkg: "flow",
    mutate: ["packages/flow/src/engine/harvestTurn.ts:61-134"],
  },
  "harvestTurn-verdict": {
    pkg: "flow",
    mutate: ["packages/flow/src/engine/harvestTurn.ts:135-284"],
  },
  // exactly-once delivery of results into the parent's journal
  "db-delivery": { pkg: "db", mutate: ["packages/db/src/delegation/delivery.ts"] },
  // a call's run row: created once per tool call, started, settled once, fenced by its generation
  "db-runs": { pkg: "db", mutate: ["packages/db/src/delegation/runs.ts"] },
  // boot and takeover recovery: owner leases, claims, private fork copies, dangling tool calls
  "db-recovery": { pkg: "db", mutate: ["packages/db/src/delegation/recovery.ts"] },
  // a child's result settled once, fenced by its generation, with its spill: the whole file (the start and
  // its fence, the first turn and the settling mark, the child's turns, the settlement drain and its bound,
  // a workflow summary's spill, a failure's error code)
  "brain-settlement": { pkg: "brain", mutate: ["packages/brain/src/delegation/settlement.ts"] },
  // results carried into the parent's next turn
  // the whole file: the message a result becomes and deliverQueued
  "brain-delivery": { pkg: "brain", mutate: ["packages/brain/src/delegation/delivery.ts"] },
  // boot recovery of a daemon's interrupted calls
  "brain-recovery": {
    pkg: "brain",
    // the whole module: boot and takeover recovery of the claimed runs (the batch, its tails, the
    // generations, settle, charged or free continuation, the answer to a call of unknown outcome)
    mutate: ["packages/brain/src/delegation/recovery.ts"],
  },
  // the scope a delegation captures from its parent
  "brain-capture": { pkg: "brain", mutate: ["packages/brain/src/scope/capture.ts"] },
  // the runner pool, the whole file: admission and abort, slot leases (pump, dispatch, settle), the startup
  // episode (fork, retry, adopt, terminal failure, mismatch latch), a runner's exit, reset, close, health,
  // the sinks and the host-call handler; its vitest config runs the pool's own suites and the two that reach
  // the host-call handler and the usage sink
  "subagent-pool": { pkg: "subagent", mutate: ["packages/subagent/src/pool.ts"] },
  // the frames between the daemon and its runners
  "subagent-protocol": {
    pkg: "subagent",
    mutate: ["packages/subagent/src/protocol/*.ts", "!packages/subagent/src/protocol/index.ts"],
  },
  // a workflow's run: nodes dispatched, settled, their dependents released
  "workflow-run": {
    pkg: "workflow",
    // dependents blocked or released (blockDependents, pump); a node's outcome settled (empty, failed,
    // aborted; what a settlement releases) and cancel. Narrowed to fit 2 shared cores
    mutate: ["plugins/subagent/src/engine/run.ts:303-343", "plugins/subagent/src/engine/run.ts:703-743"],
  },
  // the rest of run.ts in three runs that each fit a session: a node's execution (its fresh reservation,
  // the child's creation and turn, a continuation after boot or an explicit resume, a failed node); its
  // preparation (the protected scope of a boot continuation, the model and scope checks, the dependencies'
  // read grants); the workflow's finish and delivery to its parent
  "workflow-run-execute": {
    pkg: "workflow",
    mutate: ["plugins/subagent/src/engine/run.ts:365-500"],
  },
  "workflow-run-prepare": {
    pkg: "workflow",
    mutate: ["plugins/subagent/src/engine/run.ts:501-657"],
  },
  "workflow-run-delivery": {
    pkg: "workflow",
    mutate: ["plugins/subagent/src/engine/run.ts:745-847"],
  },
  // what is left of run.ts: the run's own state (its stop, foreground and background, the group-committed
  // journal write, its snapshot and publication), a node's launch and the first half of its settlement
  "workflow-run-state": {
    pkg: "workflow",
    mutate: [
      "plugins/subagent/src/engine/run.ts:146-302",
      "plugins/subagent/src/engine/run.ts:344-364",
      "plugins/subagent/src/engine/run.ts:658-702",
    ],
  },
  // a workflow's start (its journal built from the definition, the created receipt adopted, a lost race
  // answered with the existing workflow) and WorkflowAddNodes (validated, journaled, published)
  "workflow-start": {
    pkg: "workflow",
    mutate: ["plugins/subagent/src/engine/engine.ts:244-441"],
  },
  // a workflow engine's boot recovery
  "workflow-recovery": {
    pkg: "workflow",
    // explicit resume's generation advance and node reset, boot recovery (the claim pass, the claimed
    // journals, one workflow's resume); narrowed to fit 2 shared cores
    mutate: [
      "plugins/subagent/src/engine/engine.ts:540-572",
      "plugins/subagent/src/engine/engine.ts:591-673",
      "plugins/subagent/src/engine/engine.ts:674-749",
    ],
  },
};

/**
 * One module per run (MUTATION_MODULE, default journal): each run keeps its own incremental file and
 * report, so a module that is done stays done when a later run is stopped.
 */
const module = process.env.MUTATION_MODULE ?? "journal";
const target = MODULES[module];
if (!target) throw new Error(`MUTATION_MODULE=${module}: not one of ${Object.keys(MODULES).join(", ")}`);
const { pkg, mutate } = target;
const { dir, pg, dist } = PACKAGES[pkg];
const [top] = dir.split("/");
// the report names say the package: flow-journal.*, db-delivery.*
const out = `reports/mutation/${module.startsWith(`${pkg}-`) ? module : `${pkg}-${module}`}`;

/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  testRunner: "vitest",
  plugins: ["@stryker-mutator/vitest-runner"],
  vitest: {
    configFile: `${dir}/vitest.stryker.config.ts`,
    dir,
    related: true,
  },
  coverageAnalysis: "perTest",
  mutate,
  ignorePatterns: [
    "/*",
    "!/package.json",
    "!/tsconfig.base.json",
    "!/tools",
    // the test kit migrates its template database from the root's migrations/
    ...(pg ? ["!/migrations"] : []),
    `!/${top}`,
    `/${top}/*`,
    `!/${dir}`,
    ...(dist ? [] : [`/${dir}/dist`]),
    `/${dir}/.reports`,
  ],
  // a static mutant (a module-level constant) reruns every test: too slow on 2 cores; they are reported as ignored
  ignoreStatic: true,
  concurrency: 1,
  // added to each test's own time: a mutant that hangs a recovery costs this and a restart of the runner;
  // 10 s is still far above any covering test's spread
  timeoutMS: 10_000,
  incremental: true,
  incrementalFile: `${out}.incremental.json`,
  reporters: ["clear-text", "progress", "html", "json"],
  htmlReporter: { fileName: `${out}.html` },
  jsonReporter: { fileName: `${out}.json` },
  clearTextReporter: { allowColor: false, logTests: false, reportScoreTable: true },
  // one sandbox directory per module: runs of different modules may go on side by side
  tempDirName: `reports/mutation/.stryker-tmp-${module}`,
  cleanTempDir: true,
};
