import { homedir } from "node:os";
import { isAbsolute, join, resolve } from "node:path";
import { FlowError } from "../util/errors.js";

/** Lightweight (no zod): the owner commands that run once per step load this module. */

const RUN_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$/;

export function checkRunId(id: string): string {
  if (!RUN_ID.test(id) || id.includes("..")) {
    throw new FlowError(
      "run_id_invalid",
      `run id '${id}' is not valid: letters, digits, '.', '_' and '-' only (no path characters)`,
      2,
    );
  }
  return id;
}

/** The state directory: --state, else CRW_STATE, else $XDG_STATE_HOME/crw, else ~/.local/state/crw. */
export function stateDirFrom(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  const raw = flag ?? env.CRW_STATE;
  if (raw) return isAbsolute(raw) ? raw : resolve(raw);
  const xdg = env.XDG_STATE_HOME;
  return join(xdg && isAbsolute(xdg) ? xdg : join(homedir(), ".local", "state"), "crw");
}

/** Every path of one run under `<state>/flow/<run>/`. */
export interface RunPaths {
  state: string;
  runId: string;
  dir: string;
  spec: string;
  journal: string;
  steps: string;
  inbox: string;
  replies: string;
  workspaces: string;
  startLock: string;
  runLock: string;
  log: string;
}

export function runPaths(state: string, runId: string): RunPaths {
  const dir = join(state, "flow", checkRunId(runId));
  return {
    state,
    runId,
    dir,
    spec: join(dir, "run.json"),
    journal: join(dir, "journal.jsonl"),
    steps: join(dir, "steps"),
    inbox: join(dir, "inbox"),
    replies: join(dir, "replies"),
    workspaces: join(dir, "workspaces"),
    startLock: join(dir, "start.lock"),
    runLock: join(dir, "run.lock"),
    log: join(dir, "process.log"),
  };
}

export function processLockPath(paths: RunPaths, token: string): string {
  return join(paths.dir, `process.${token}.lock`);
}
