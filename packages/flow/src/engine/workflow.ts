import { pathToFileURL } from "node:url";
import { z } from "zod";
import type { CallInput, JournalRow } from "../journal/rows.js";
import { isRole, type RoleName } from "../run/roles.js";
import type { RunSpec } from "../run/spec.js";
import { FlowError } from "../util/errors.js";
import { checkSchema } from "./answer.js";

/** What a workflow's `ctx.call` takes. `schema` is a JSON Schema object or a zod schema (converted). */
export interface CallOptions {
  role: RoleName;
  task: string;
  schema?: Record<string, unknown> | z.ZodType;
  /** A directory the call works in instead of a scratch directory of its own. */
  workspace?: string;
  /** The node the call belongs to: its op id is `<node>.<n>` (default node: the role). */
  node?: string;
  /**
   * A continuation: the op id (`<node>.<n>`) of a finished call this call continues. It runs on a new
   * subagent whose packet carries the continued call's packet, its answer and the record of its turns.
   */
  resume?: string;
  /**
   * A continuation's explicit reasoning effort. Compared with the effort the handle's subagent ran when
   * the role leaves its effort undecided (with the role's effort when it decides one): a difference is
   * pair_refused. The continuation's step asks for it and its bind checks it.
   */
  effort?: string;
  /**
   * How long each attempt of the call may run, in milliseconds, counted from its first step (on the local
   * backend, its first turn). Past it, the running turn is interrupted (read until it runs no more), the
   * call is held for `deadline` and the run pauses: a resume gives the call a new attempt with a whole
   * deadline, `crw flow cancel` ends the run. At most seven days.
   */
  deadlineMs?: number;
}

/**
 * What a call did to the run's branch (the run's repository is a git checkout): `start` is the commit its
 * checkout started from, `commit` crw's commit of its changes (an executor that changed something; null
 * otherwise), `paths` the paths that commit changed. Read from the call's completed row, so a resumed run
 * answers the same.
 */
export interface CallWork {
  start: string;
  commit: string | null;
  paths: string[];
}

export interface CallOutcome<T> {
  /** The call's op id (`<node>.<n>`): a handle for `resume`. */
  op: string;
  answer: T;
  /** Null when the run's repository is no git checkout or the call was given its own directory. */
  work: CallWork | null;
}

export interface FlowContext {
  readonly runId: string;
  /** Runs one agent call as a session call; answers the schema-valid answer. */
  call<T = Record<string, unknown>>(options: CallOptions): Promise<T>;
  /** The same call, answered with its op id and what it changed on the run's branch. */
  callWithWork<T = Record<string, unknown>>(options: CallOptions): Promise<CallOutcome<T>>;
  /**
   * Waits for a decision a person gives with `crw flow answer RUN ID ANSWER`: the run pauses
   * (waiting_decision) until it is answered, then a resume returns the answer here. Answered decisions
   * replay from the journal.
   */
  decide(options: DecideOptions): Promise<string>;
}

export interface DecideOptions {
  /** The decision's id, unique in the run (the answer names it). */
  id: string;
  question: string;
  /** The answers allowed; absent: any text. */
  options?: string[];
}

/**
 * A workflow: `run(ctx, input)` makes agent calls through `ctx`. It must be deterministic: on resume it
 * runs again, and each call's op id (its node and its number within the node) and input digest must come
 * out as before, or the resume is refused naming the op.
 */
export interface Workflow<I = unknown, O = unknown> {
  name: string;
  run(ctx: FlowContext, input: I): Promise<O>;
}

export function defineWorkflow<I = unknown, O = unknown>(workflow: Workflow<I, O>): Workflow<I, O> {
  return workflow;
}

/**
 * A call's failure as the workflow sees it: the call ended null_model. `details` are what the reason is
 * about (a merge conflict's paths, an invalid answer's errors).
 */
export class FlowCallError extends Error {
  override readonly name = "FlowCallError";
  constructor(
    readonly op: string,
    readonly reason: string,
    readonly details: readonly string[] = [],
  ) {
    super(`call ${op} ended null_model: ${reason}${details.length > 0 ? ` (${details.join(", ")})` : ""}`);
  }
}

/** The workflow's error for a call whose terminal row is null_model. */
export function callFailed(row: { op: string; reason: string; errors?: string[] }): FlowCallError {
  return new FlowCallError(row.op, row.reason, row.reason === "merge_conflict" ? (row.errors ?? []) : []);
}

/**
 * The workflow module a run's processes run: the one its newest started row names (a resume given
 * another module), else the one run.json names.
 */
export function runWorkflowPath(rows: readonly JournalRow[], spec: Pick<RunSpec, "workflow">): string {
  for (let i = rows.length - 1; i >= 0; i--) {
    const r = rows[i];
    if (r?.type === "started") return r.workflow ?? spec.workflow;
  }
  return spec.workflow;
}

export async function loadWorkflow(path: string): Promise<Workflow> {
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(path).href)) as Record<string, unknown>;
  } catch (e) {
    throw new FlowError("workflow_invalid", `cannot load workflow ${path}: ${(e as Error).message}`, 2);
  }
  const w = mod.default as Partial<Workflow> | undefined;
  if (
    !w ||
    typeof w !== "object" ||
    typeof w.name !== "string" ||
    w.name === "" ||
    typeof w.run !== "function"
  ) {
    throw new FlowError(
      "workflow_invalid",
      `${path}: the default export is not a workflow (defineWorkflow({ name, run }) or { name, run })`,
      2,
    );
  }
  return w as Workflow;
}

export interface NormalizedCall {
  role: RoleName;
  task: string;
  schema: Record<string, unknown> | null;
  workspace: string | null;
  node: string;
  resume: string | null;
  effort: string | null;
  deadlineMs: number | null;
}

/**
 * The call's input as the journal records and digests it, the continued call's thread chain given by the
 * caller (the run's from its continuation, a replay's from the journal).
 */
export function callInput(n: NormalizedCall, resume: CallInput["resume"] | undefined): CallInput {
  return {
    role: n.role,
    task: n.task,
    schema: n.schema,
    workspace: n.workspace,
    ...(resume ? { resume } : {}),
    ...(n.effort ? { effort: n.effort } : {}),
    ...(n.deadlineMs ? { deadline_ms: n.deadlineMs } : {}),
  };
}

const MAX_DEADLINE_MS = 7 * 24 * 3600 * 1000;
const NODE = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/;

/** Checks a call's options once; a bad call is the workflow's input error. */
export function normalizeCall(options: CallOptions): NormalizedCall {
  const bad = (what: string): never => {
    throw new FlowError("workflow_invalid", `ctx.call: ${what}`, 2);
  };
  if (!options || typeof options !== "object") bad("options are not an object");
  if (!isRole(options.role)) bad(`role '${String(options.role)}' is not one of the six roles`);
  if (typeof options.task !== "string" || options.task.trim() === "") bad("task is not a non-empty string");
  const node = options.node ?? options.role;
  if (!NODE.test(node)) bad(`node '${node}' is not a plain name (letters, digits, '_' and '-')`);
  let schema: Record<string, unknown> | null = null;
  if (options.schema !== undefined) {
    const s = options.schema as unknown;
    if (s && typeof s === "object" && "_zod" in (s as object)) {
      schema = z.toJSONSchema(s as z.ZodType) as Record<string, unknown>;
    } else if (s && typeof s === "object" && !Array.isArray(s)) {
      schema = s as Record<string, unknown>;
    } else bad("schema is neither a JSON Schema object nor a zod schema");
    try {
      checkSchema(schema as Record<string, unknown>);
    } catch (e) {
      bad(`schema cannot be used: ${(e as Error).message}`);
    }
  }
  if (
    options.workspace !== undefined &&
    (typeof options.workspace !== "string" || !options.workspace.startsWith("/"))
  )
    bad("workspace is not an absolute path");
  if (
    options.resume !== undefined &&
    (typeof options.resume !== "string" || !/^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\.\d+$/.test(options.resume))
  )
    bad("resume is not the op id of a call (<node>.<n>)");
  if (options.effort !== undefined) {
    if (typeof options.effort !== "string" || !/^[a-z][a-z_-]{0,31}$/.test(options.effort))
      bad("effort is not an effort name (e.g. low, medium, high)");
    if (options.resume === undefined) bad("effort is a continuation's option (give it with resume)");
  }
  if (
    options.deadlineMs !== undefined &&
    (!Number.isInteger(options.deadlineMs) || options.deadlineMs <= 0 || options.deadlineMs > MAX_DEADLINE_MS)
  )
    bad("deadlineMs is not a whole number of milliseconds from 1 to seven days");
  return {
    role: options.role,
    task: options.task,
    schema,
    workspace: options.workspace ?? null,
    node,
    resume: options.resume ?? null,
    effort: options.effort ?? null,
    deadlineMs: options.deadlineMs ?? null,
  };
}
