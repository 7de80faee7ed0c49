import { execFile, execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, realpathSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { FakeAppServer } from "@crw/tools/codex";

export const repoRoot = resolve(import.meta.dirname, "../../../..");
// Through node_modules: a copy of the tree that holds packages/flow alone (a mutation run's sandbox) still
// spawns the built CLI.
export const crwBin = join(realpathSync(join(repoRoot, "node_modules/@crw/cli")), "bin/crw.mjs");
/** The built @crw/flow a spawned process imports (the checkout's own, as for crwBin). */
export const builtFlow = join(realpathSync(join(repoRoot, "node_modules/@crw/flow")), "dist/index.js");

let checked = false;

/**
 * The run process is the built CLI: build flow and crw when a source is newer than the build. Test files
 * run in parallel: one lock file serializes the builds, so two tsup runs of a package never overlap. A
 * worker checks once: the sources do not change while the tests run, and the check (a process walking
 * both source trees) was called a few hundred times a run.
 */
export function ensureBuilt(): void {
  if (checked) return;
  const lock = join(tmpdir(), "crw-flow-dist-build.lock");
  execFileSync("flock", [lock, process.execPath, join(import.meta.dirname, "../host/buildIfStale.mjs")], {
    stdio: "ignore",
  });
  checked = true;
}

/**
 * Builds the CLI when stale, then makes a temporary root (named after `prefix`) with a CODEX_HOME whose
 * config allows three agent threads; `env` is this process's environment with CODEX_HOME and `extra`.
 */
export function cliRoot(
  prefix: string,
  extra: NodeJS.ProcessEnv = {},
): { root: string; env: NodeJS.ProcessEnv } {
  ensureBuilt();
  const root = mkdtempSync(join(tmpdir(), prefix));
  mkdirSync(join(root, "codex-home"), { recursive: true });
  writeFileSync(join(root, "codex-home", "config.toml"), "[agents]\nmax_threads = 3\n");
  return { root, env: { ...process.env, CODEX_HOME: join(root, "codex-home"), ...extra } };
}

/**
 * Builds the CLI when stale, makes a temporary root (named after `prefix`) and starts the fake app-server
 * with an owner thread in a turn; `env` points `crw flow` at that owner and host (no fault injection).
 */
export async function ownerSession(
  prefix: string,
): Promise<{ fake: FakeAppServer; root: string; owner: string; env: NodeJS.ProcessEnv }> {
  ensureBuilt();
  const root = mkdtempSync(join(tmpdir(), prefix));
  const fake = await FakeAppServer.start();
  const owner = fake.createOwnerThread({ cwd: root });
  fake.startOwnerTurn(owner);
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    CODEX_THREAD_ID: owner,
    CRW_FLOW_HOST: fake.url,
    CODEX_HOME: join(root, "codex-home"),
  };
  delete env.CRW_FLOW_FAULT;
  return { fake, root, owner, env };
}

/**
 * A plain terminal's environment (`base`, by default this process's): no Codex owner thread or host, no
 * fault point, no model or provider settings of the caller's own; then `extra`.
 */
export function plainEnv(
  extra: NodeJS.ProcessEnv = {},
  base: NodeJS.ProcessEnv = process.env,
): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...base };
  for (const name of Object.keys(env))
    if (
      /^(CODEX_THREAD_ID|CRW_FLOW_HOST|CRW_FLOW_FAULT|CRW_FLOW_CONFIG|CRW_MODEL|OPENAI_|ANTHROPIC_)/.test(
        name,
      )
    )
      delete env[name];
  return { ...env, ...extra };
}

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
  json: () => Record<string, unknown>;
}

/**
 * Runs `crw flow …` as a real process, in `cwd` or else in the temp directory: a run's repository is its
 * cwd unless `--repo` names one, and a test's run must never make branches in this checkout.
 */
export function crwFlow(
  args: string[],
  env: NodeJS.ProcessEnv = process.env,
  cwd: string = tmpdir(),
): Promise<CliResult> {
  return new Promise((done) => {
    execFile(process.execPath, [crwBin, "flow", ...args], { env, cwd }, (err, stdout, stderr) => {
      const code = err ? Number((err as { code?: number }).code ?? 1) : 0;
      done({ code, stdout, stderr, json: () => JSON.parse(stdout) as Record<string, unknown> });
    });
  });
}

export async function waitFor<T>(
  what: string,
  check: () => T | undefined | null | false,
  timeoutMs = 20_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** `crw flow dispatched`'s arguments reporting `agent` for `step` of run `runId` in `state`, as JSON. */
export function dispatchedArgs(
  runId: string,
  step: { call: string; k: number; attempt: number },
  agent: string,
  state: string,
  extra: string[] = [],
): string[] {
  return [
    "dispatched",
    runId,
    step.call,
    "--agent",
    agent,
    "--k",
    String(step.k),
    "--attempt",
    String(step.attempt),
    ...extra,
    "--state",
    state,
    "--json",
  ];
}
