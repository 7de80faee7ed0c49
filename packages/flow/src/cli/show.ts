import { existsSync } from "node:fs";
import { runSpent } from "../engine/tokenFigure.js";
import { readJournalFile } from "../journal/journal.js";
import type { JournalRow, Tokens } from "../journal/rows.js";
import { runPaths, stateDirFrom } from "../run/paths.js";
import { readSpec } from "../run/spec.js";
import { EXIT_OK } from "../util/errors.js";
import { parseCommand, print } from "./args.js";
import { branchLines, branchView } from "./branchView.js";

interface CallView {
  call: string;
  role: string;
  status: string;
  attempts: number;
  subagents: string[];
  /** The pair of its newest bound subagent (its newest thread_started row), and the earlier ones that differ. */
  pair: { model: string | null; effort: string | null } | null;
  prior_pairs: Array<{ model: string | null; effort: string | null }>;
  steps: number;
  tokens: Tokens;
  started_at: string;
  ended_at: string | null;
  duration_ms: number | null;
  warnings: string[];
}

/** `crw flow show RUN`: the run's timeline from its journal (full validation: a corrupt journal errs). */
export async function showCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseCommand("show", args, { state: { type: "string" } }, ["RUN"]);
  const paths = runPaths(stateDirFrom(values.state), positionals[0] as string);
  const spec = readSpec(paths.spec);
  // The run's process writes its journal's first batch just after `crw flow start` returns: a show in
  // between sees a run that is starting, not a missing file.
  const started = existsSync(paths.journal);
  const read = started ? readJournalFile(paths.journal) : { rows: [] as JournalRow[], torn: undefined };
  const calls = new Map<string, CallView>();
  const runWarnings: string[] = [];
  if (read.torn) runWarnings.push(`torn last line (${read.torn.bytes} bytes) ignored`);
  let status = started ? "running" : "starting";
  let result: unknown;
  for (const r of read.rows) viewRow(r);
  function viewRow(r: JournalRow) {
    if (r.type === "run_ended") {
      status = r.status;
      result = r.result ?? r.error ?? r.reason;
      return;
    }
    if (r.type === "cancel_requested") {
      status = `cancelling (${r.reason})`;
      return;
    }
    if (r.type === "run_paused") {
      status = `paused (${r.reason})`;
      return;
    }
    if (r.type === "started") {
      if (status.startsWith("paused")) status = "running";
      return;
    }
    if (!("call" in r) || typeof r.call !== "string") return;
    const call = r.call;
    let c = calls.get(call);
    if (!c) {
      c = {
        call,
        role: "",
        status: "open",
        attempts: 0,
        subagents: [],
        pair: null,
        prior_pairs: [],
        steps: 0,
        tokens: {},
        started_at: r.at,
        ended_at: null,
        duration_ms: null,
        warnings: [],
      };
      calls.set(call, c);
    }
    switch (r.type) {
      case "prepared":
        c.role = r.role;
        break;
      case "step_published":
        c.steps++;
        c.attempts = Math.max(c.attempts, r.attempt);
        break;
      case "thread_started":
        c.subagents.push(r.thread_id);
        c.pair = { model: r.model, effort: r.effort };
        c.prior_pairs = r.prior_pairs ?? [];
        c.attempts = Math.max(c.attempts, r.attempt); // a local call's attempts publish no steps
        if (r.session_agent_role_mismatch)
          c.warnings.push(`agent role ${r.session_agent_role_mismatch.actual}`);
        break;
      case "session_attempt_lost":
        c.warnings.push(`attempt ${r.attempt} lost: ${r.reason}`);
        break;
      case "step_unwritten":
        c.warnings.push(
          `step ${r.marker} unwritten (${r.failures} failures)${r.written !== undefined ? `, written: ${r.written}` : ""}`,
        );
        break;
      case "tokens_unmeasured":
        c.warnings.push(`turn ${r.k} unmeasured`);
        break;
      case "flow_warning":
        c.warnings.push(r.warning);
        break;
      case "held":
        c.status = `held (${r.reason})`;
        if (r.tokens) c.tokens = r.tokens;
        break;
      case "completed":
      case "null_model":
        c.status = r.type === "completed" ? "completed" : `null_model (${r.reason})`;
        c.tokens = r.tokens;
        c.ended_at = r.at;
        c.duration_ms = Date.parse(r.at) - Date.parse(c.started_at);
        break;
      default:
        break;
    }
  }
  const view = {
    run_id: spec.run_id,
    workflow: spec.workflow_name,
    status,
    result,
    /** RunSpent: each call counted once, by its newest terminal row. */
    tokens: runSpent(read.rows),
    ...(spec.token_ceiling !== undefined ? { token_ceiling: spec.token_ceiling } : {}),
    calls: [...calls.values()],
    /** The run's branch and its commits (null: the repository is no git checkout). */
    branch: await branchView(read.rows, spec.repo),
    warnings: runWarnings,
  };
  const human = [
    `run ${spec.run_id} (${spec.workflow_name}): ${status}`,
    ...view.calls.map(
      (c) =>
        `  ${c.call.padEnd(16)} ${c.role.padEnd(11)} ${c.status.padEnd(12)} attempts ${c.attempts} steps ${c.steps} tokens ${c.tokens.total ?? 0}${c.duration_ms !== null ? ` ${c.duration_ms} ms` : ""}${c.warnings.length ? `  [${c.warnings.join("; ")}]` : ""}`,
    ),
    ...(view.branch ? branchLines(view.branch) : []),
    `  tokens ${view.tokens.total ?? 0}${view.token_ceiling !== undefined ? ` (ceiling ${view.token_ceiling})` : ""}`,
    ...runWarnings.map((w) => `warning: ${w}`),
  ].join("\n");
  print(values.json, view, human);
  return EXIT_OK;
}
