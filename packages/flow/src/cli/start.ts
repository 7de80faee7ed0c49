import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, statSync } from "node:fs";
import { isAbsolute, resolve } from "node:path";
import { resolveLocalModel } from "../backends/localModel.js";
import { readLocalScript } from "../backends/localScript.js";
import { bindRunOwner } from "../bound/run.js";
import { readCodexSettings } from "../run/codexConfig.js";
import { launchRunProcess } from "../run/launch.js";
import { readLightRows } from "../run/lightJournal.js";
import { lockHolder, tryLock, unlock } from "../run/locks.js";
import { checkRunId, runPaths, stateDirFrom } from "../run/paths.js";
import { ROLE_NAMES, readRoleTable, rolePairs, spawnFormat } from "../run/roles.js";
import { type LocalSpec, type RunSpec, SPEC_FORMAT, writeSpec } from "../run/spec.js";
import { dirFrom } from "../run/tmploc.js";
import { EXIT_OK, EXIT_REFUSED, FlowError } from "../util/errors.js";
import { privateDir, sleep } from "../util/fsx.js";
import { pidAlive } from "../util/liveness.js";
import { intOption, parseCommand, print } from "./args.js";
import { ownerHostReachable, sessionFacts } from "./sessionFacts.js";

/** How long the start holds its start lock waiting for the run's process to hold the run lock. */
const HANDOVER_MS = 15_000;

/**
 * `crw flow start WORKFLOW …`: validates everything before it writes the spec (the workflow module, the
 * input, the backend, the owner, the state directory, the TMPDIR through tmploc: a TMPDIR that cannot be
 * used stops the start with exit 1 before the spec or any process), writes run.json, starts the run's
 * process detached under the start lock, and prints the preview and the `next` command.
 */
export async function startCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseCommand(
    "start",
    args,
    {
      state: { type: "string" },
      input: { type: "string" },
      backend: { type: "string" },
      owner: { type: "string" },
      pool: { type: "string" },
      host: { type: "string" },
      run: { type: "string" },
      repo: { type: "string" },
      "poll-ms": { type: "string" },
      trace: { type: "boolean" },
      evidence: { type: "boolean" },
      "lost-after-ms": { type: "string" },
      "token-ceiling": { type: "string" },
      "refusal-bound": { type: "string" },
      model: { type: "string" },
      script: { type: "string" },
      "model-base-url": { type: "string" },
      "model-api-key-env": { type: "string" },
      config: { type: "string" },
    },
    ["WORKFLOW"],
  );
  const workflowPath = resolve(positionals[0] as string);
  if (!existsSync(workflowPath) || !statSync(workflowPath).isFile()) {
    throw new FlowError("input", `workflow ${workflowPath} is not a file`, 2);
  }
  const owner = values.owner ?? process.env.CODEX_THREAD_ID ?? null;
  // with no --backend: a start inside a Codex session (an owner thread is known) is a session run, a start
  // from a plain terminal a local run
  const backend = values.backend ?? (owner ? "session" : "local");
  if (backend !== "session" && backend !== "local" && backend !== "app-server") {
    throw new FlowError("input", `unknown backend '${backend}' (session, local or app-server)`, 2);
  }
  const input = parseInput(values.input);
  const localFlags = ["model", "script", "model-base-url", "model-api-key-env", "config"] as const;
  if (backend !== "local" && localFlags.some((f) => values[f] !== undefined)) {
    throw new FlowError(
      "input",
      `${localFlags.map((f) => `--${f}`).join(", ")} are options of --backend local`,
      2,
    );
  }
  const local = backend === "local" ? localOptions(values) : undefined;
  if (backend === "session" && !owner) {
    throw new FlowError(
      "input",
      "no owner thread: pass --owner THREAD or run inside a Codex session (CODEX_THREAD_ID)",
      2,
    );
  }
  const codex = readCodexSettings();
  const asked = intOption("pool", values.pool, 4, 1);
  const tokenCeiling =
    values["token-ceiling"] === undefined
      ? undefined
      : intOption("token-ceiling", values["token-ceiling"], 0, 1);
  const pool = backend === "local" ? asked : Math.min(asked, Math.max(1, codex.maxThreads - 1));
  const repo = values.repo ? resolve(values.repo) : process.cwd();
  const table = readRoleTable(repo);
  const { loadWorkflow } = await import("../engine/workflow.js");
  const workflow = await loadWorkflow(workflowPath);
  const tmp = dirFrom(process.env);
  if (!tmp.ok) throw new FlowError("tmpdir_unusable", `the start is refused: ${tmp.reason}`, EXIT_REFUSED);
  const state = stateDirFrom(values.state);
  const runId = values.run
    ? checkRunId(values.run)
    : `${slug(workflow.name)}-${Date.now().toString(36)}-${randomBytes(2).toString("hex")}`;
  const paths = runPaths(state, runId);
  try {
    // a new state directory is the user's alone; crw's flow/ under it is narrowed if it is wider
    mkdirSync(state, { recursive: true, mode: 0o700 });
    const was = privateDir(resolve(state, "flow"));
    if (was) process.stderr.write(`crw flow: ${resolve(state, "flow")} was mode ${was}; narrowed to 700\n`);
    mkdirSync(paths.dir, { mode: 0o700 });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "EEXIST")
      throw new FlowError("input", `run ${runId} exists already`, 2);
    throw new FlowError(
      "state_unwritable",
      `cannot make the run directory ${paths.dir}: ${(e as Error).message}`,
      2,
    );
  }
  const spec: RunSpec = {
    format: SPEC_FORMAT,
    run_id: runId,
    workflow: workflowPath,
    workflow_name: workflow.name,
    input,
    backend,
    owner,
    ...(local ? { local } : {}),
    pool,
    repo,
    host: values.host ?? process.env.CRW_FLOW_HOST ?? "",
    created_at: new Date().toISOString(),
    env: { TMPDIR: tmp.dir },
    ...(values.trace ? { trace: true } : {}),
    ...(values.evidence ? { evidence: true } : {}),
    ...(values["poll-ms"] ? { poll_ms: intOption("poll-ms", values["poll-ms"], 500, 1) } : {}),
    ...(values["lost-after-ms"]
      ? { lost_after_ms: intOption("lost-after-ms", values["lost-after-ms"], 600_000, 1) }
      : {}),
    ...(tokenCeiling !== undefined ? { token_ceiling: tokenCeiling } : {}),
    ...(values["refusal-bound"] !== undefined
      ? { refusal_bound: intOption("refusal-bound", values["refusal-bound"], 3, 1) }
      : {}),
  };
  if (!tryLock(paths.startLock))
    throw new FlowError("run_live", `run ${runId} is being started by another process`, 1);
  let pid: number;
  let bind: ReturnType<typeof bindRunOwner> | null = null;
  try {
    writeSpec(paths.spec, spec);
    // a session run's owner is bound before any process of the run exists (the start lock makes it live)
    if (backend === "session" && owner)
      bind = bindRunOwner({
        state,
        owner,
        runId,
        policyDigest: table.policy_digest,
        rolePairs: rolePairs(table),
      });
    pid = launchRunProcess(paths, spec);
    const deadline = Date.now() + HANDOVER_MS;
    while (Date.now() < deadline && !lockHolder(paths.runLock) && pidAlive(pid)) await sleep(25);
  } finally {
    unlock(paths.startLock);
  }
  const recorded = () => readLightRows(paths.journal).some((r) => r.type === "started" && r.pid === pid);
  if (!lockHolder(paths.runLock) && !pidAlive(pid) && !recorded()) {
    throw new FlowError(
      "run_live",
      `the run's process (pid ${pid}) ended before it held the run; see ${paths.log}, then: crw flow resume ${runId}`,
      EXIT_REFUSED,
    );
  }
  const facts =
    owner && backend === "session"
      ? [
          ...sessionFacts({ owner, codex, paths, repo, table, bind, pool }),
          await ownerHostReachable(values.host ?? process.env.CRW_FLOW_HOST ?? ""),
        ]
      : [];
  const crw = `${process.execPath} ${process.argv[1] ?? "crw"}`;
  const stateFlag = values.state ? ` --state ${state}` : "";
  // the owner takes a session run's steps with next; a local or app-server run has no owner steps:
  // it is followed with show
  const show = `${crw} flow show ${runId}${stateFlag}`;
  const next = backend === "session" ? `${crw} flow next ${runId}${stateFlag} --wait 10 --json` : null;
  const answer = {
    run_id: runId,
    pid,
    backend,
    owner,
    ...(local ? { model: local.model } : {}),
    ...(local?.base_url ? { model_base_url: local.base_url } : {}),
    ...(local?.api_key_env ? { model_api_key_env: local.api_key_env } : {}),
    pool,
    state_dir: paths.dir,
    spawn_formats: backend === "session" ? ROLE_NAMES.map((r) => spawnFormat(r, table.roles[r])) : [],
    facts,
    next,
    show,
  };
  const human = [
    backend === "local"
      ? `run ${runId} started (pid ${pid}) on the local backend, model ${local?.model}${local?.base_url ? ` at ${local.base_url}` : ""}, pool ${pool}`
      : backend === "app-server"
        ? `run ${runId} started (pid ${pid}) on the app-server backend, pool ${pool}`
        : `run ${runId} started (pid ${pid}), owner ${owner}, pool ${pool}`,
    ...facts.filter((f) => !f.ok).map((f) => `warning: ${f.fact}: ${f.detail}`),
    next === null ? `Follow it with: ${show}` : `Take its steps with: ${next}`,
  ].join("\n");
  print(values.json, answer, human);
  return EXIT_OK;
}

function parseInput(raw: string | undefined): unknown {
  if (raw === undefined) return null;
  let text = raw;
  if (raw.startsWith("@")) {
    const path = raw.slice(1);
    try {
      text = readFileSync(isAbsolute(path) ? path : resolve(path), "utf8");
    } catch {
      throw new FlowError("input", `--input ${raw}: cannot read the file`, 2);
    }
  }
  try {
    return JSON.parse(text);
  } catch {
    throw new FlowError("input", "--input is not JSON (give JSON or @file)", 2);
  }
}

/**
 * The local backend's model, its server and key variable (flags, environment, config file: localModel.ts)
 * and its script file, checked before anything is written (no provider loads here).
 */
function localOptions(
  values: {
    [K in "model" | "script" | "model-base-url" | "model-api-key-env" | "config" | "state"]?: string;
  },
): LocalSpec {
  const script = values.script;
  const chosen = resolveLocalModel({
    model: values.model,
    script,
    baseUrl: values["model-base-url"],
    apiKeyEnv: values["model-api-key-env"],
    config: values.config,
    state: stateDirFrom(values.state),
    env: process.env,
  });
  if (script !== undefined && chosen.model !== "scripted")
    throw new FlowError("input", "--script goes with --model scripted", 2);
  const path = script === undefined ? null : resolve(script);
  if (path) readLocalScript(path);
  return { ...chosen, script: path };
}

function slug(name: string): string {
  return (
    name
      .toLowerCase()
      .replace(/[^a-z0-9]+/g, "-")
      .replace(/^-+|-+$/g, "")
      .slice(0, 40) || "run"
  );
}
