import { statSync } from "node:fs";
import { join } from "node:path";
import { ownerLineWarning } from "../bound/run.js";
import { readCodexSettings } from "../run/codexConfig.js";
import { launchRunProcess, recordedTmpdirProblem } from "../run/launch.js";
import type { LightRow } from "../run/lightJournal.js";
import { openCallAgents } from "../run/ownerView.js";
import { type RunPaths, runPaths, stateDirFrom } from "../run/paths.js";
import { ROLE_NAMES, type RoleName, type RoleTable, readRoleTable, spawnFormat } from "../run/roles.js";
import { type RunState, readRunState } from "../run/runState.js";
import { readSpec } from "../run/spec.js";
import { listStepFiles, type StepFile } from "../steps/stepBus.js";
import { EXIT_OK } from "../util/errors.js";
import { removeIfExists, sleep } from "../util/fsx.js";
import { numberOption, parseCommand, print } from "./args.js";
import { decisionOf, hostDown, SAME_ASKS_NOTE, sameAsks } from "./nextNotes.js";
import { RunWatch } from "./runWatch.js";

/** How long `next` reads a starting run again, whatever --wait says (CRW_FLOW_STARTING_MS for tests). */
const STARTING_WINDOW_MS =
  Number(process.env.CRW_FLOW_STARTING_MS) > 0 ? Number(process.env.CRW_FLOW_STARTING_MS) : 15_000;
/** The bound of each wait: the watch ends it sooner when the run's files change. */
const POLL_MS = 100;

export async function nextCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseCommand(
    "next",
    args,
    { state: { type: "string" }, wait: { type: "string" } },
    ["RUN"],
  );
  const paths = runPaths(stateDirFrom(values.state), positionals[0] as string);
  const watch = new RunWatch(paths);
  try {
    return await next(values, paths, watch);
  } finally {
    watch.close();
  }
}

async function next(
  values: { state?: string; wait?: string; json?: boolean },
  paths: RunPaths,
  watch: RunWatch,
): Promise<number> {
  const waitMs = numberOption("wait", values.wait, 0) * 1000;
  const spec = readSpec(paths.spec);
  const warnings: string[] = [];
  let resumedPid: number | null = null;
  const t0 = Date.now();

  // each look follows the calls it saw open, so a wait after it wakes when one of their files lands
  let since = watch.version;
  const look = () => {
    since = watch.version;
    const listed = listStepFiles(paths.steps);
    const state = readRunState(paths, listed.steps.length > 0);
    watch.follow(state.view);
    return { listed, state };
  };
  let { listed, state } = look();
  if (state.kind === "unheld") {
    const problem = recordedTmpdirProblem(spec);
    if (problem) warnings.push(`the run is not held by any process and its resume did not start: ${problem}`);
    else {
      resumedPid = launchRunProcess(paths, spec);
      ({ listed, state } = look());
      if (state.kind === "unheld") state = { ...state, kind: "starting" };
    }
  }
  // A starting run is read again, up to 15 s whatever --wait says; never an earlier process's pins.
  while (state.kind === "starting" && Date.now() - t0 < STARTING_WINDOW_MS) {
    await watch.wait(since, POLL_MS);
    ({ listed, state } = look());
    if (state.kind === "unheld" && resumedPid !== null) state = { ...state, kind: "starting" };
  }
  // --wait: until a step shows or the state changes.
  const firstKind = state.kind;
  while (waitMs > 0 && listed.steps.length === 0 && listed.closes.length === 0 && Date.now() - t0 < waitMs) {
    if (state.kind !== firstKind || state.kind === "ended" || state.kind === "paused") break;
    await watch.wait(since, Math.min(POLL_MS, Math.max(1, waitMs - (Date.now() - t0))));
    ({ listed, state } = look());
  }

  // The owner's line only read (the holder writes it right after its started row): a holder under the
  // starting window past taking its process lock whose line is not yet its own is read again, then the
  // line is reported as it is.
  let lineWarning: ReturnType<typeof ownerLineWarning> = null;
  if (state.holderStarted && spec.owner && spec.backend === "session") {
    const read = () =>
      ownerLineWarning({
        state: paths.state,
        owner: String(spec.owner),
        runId: spec.run_id,
        policyDigest: String(state.holderStarted?.policy_digest),
      });
    lineWarning = read();
    const since = processLockTakenAt(paths.dir, state.holderStarted);
    while (lineWarning && since !== null && Date.now() - since < STARTING_WINDOW_MS) {
      await sleep(POLL_MS);
      lineWarning = read();
    }
    if (lineWarning) warnings.push(`${lineWarning.warning}: ${lineWarning.message}`);
  }

  const codex = readCodexSettings();
  let store: RoleTable | null = null;
  try {
    store = readRoleTable(spec.repo);
  } catch (e) {
    warnings.push(`the role store cannot be read: ${(e as Error).message}`);
  }
  const formats = spawnFormats(state, store);
  if (state.holderStarted && store && state.holderStarted.policy_digest !== store.policy_digest) {
    warnings.push(
      "the role store reads other pairs than the run's process pinned; it runs on its pins until a resume takes the new ones",
    );
  }
  if (resumedPid !== null && state.holderStarted) {
    const repinned = state.view.repinnedSeq;
    if (repinned !== null && repinned > state.holderStarted.seq)
      warnings.push("the resumed process repinned the role pairs: it runs on the role store as it reads now");
  }
  for (const bad of listed.bad) warnings.push(`a step file cannot be read and is not handed out: ${bad}`);

  const crw = `${process.execPath} ${process.argv[1] ?? "crw"}`;
  const stateFlag = values.state ? ` --state ${paths.state}` : "";
  // a step whose marker already has a turn_started row was taken (a process that died right after the
  // bind leaves its file until the resumed process retracts it): never handed out twice
  const turned = new Set(state.view.turned);
  const steps = listed.steps
    .filter((s) => s.run_id === spec.run_id && !turned.has(s.marker))
    .map((s) => stepOut(s, crw, spec.run_id, stateFlag));
  const closes = listed.closes.map((c) => ({
    call: c.call,
    attempt: c.attempt,
    action: "close",
    agent_id: c.agent_id,
    host_call: { tool: "close_agent", arguments: { target: c.agent_id } },
  }));
  // the subagents of calls not ended (bound, not lost, not closed) and the close steps not taken
  const open = [...new Set([...listed.closes.map((c) => c.agent_id), ...openCallAgents(state.view)])];
  const slots = { limit: codex.maxThreads, open: open.length, agents: open };
  const full = open.length >= codex.maxThreads;
  // A close file is handed out once.
  for (const c of listed.closes) removeIfExists(c.path);

  // A run paused on a decision waits for `crw flow answer`, not for a fix and a resume.
  const decision =
    state.kind === "paused" ? /^waiting_decision:(.+)$/.exec(state.pausedReason ?? "")?.[1] : undefined;
  const kind =
    state.kind === "unheld" ? "starting" : decision !== undefined ? "waiting_decision" : state.kind;
  let hint = hintFor(kind, steps.length, closes, open, full, resumedPid, crw, spec.run_id, stateFlag, waitMs);
  const waiting = decision !== undefined ? decisionOf(state.view, decision) : null;
  if (waiting) hint = `${waiting.question} ${hint}`;
  const host = kind === "ended" ? null : hostDown(state.view);
  // a host that went down (or came back) is a change: the ask that first tells it is no repeat
  const seen = [
    kind,
    decision ?? "",
    ...(host ? [`host_down:${host.host}`] : []),
    ...closes.map((c) => c.agent_id),
    ...steps.map((s) => `${s.op}/${s.attempt}`),
  ].join(" ");
  const asks = sameAsks(paths.dir, seen, waitMs > 0);
  if (asks >= SAME_ASKS_NOTE && kind !== "ended")
    hint = `Nothing changed since your last ${asks - 1} asks. Wait for the next change instead of asking again: ${crw} flow next ${spec.run_id}${stateFlag} --wait 30 --json (or wait_agent on the open subagents). ${hint}`;
  // the diagnosis comes first: no wait helps until the host is fixed
  if (host) {
    warnings.push(`crw cannot reach the owner's Codex host ${host.host}: ${host.why}`);
    hint = `crw cannot reach the owner's Codex host ${host.host}: ${host.why}. To fix: ${host.fix}. ${hint}`;
  }
  const answer = {
    run_id: spec.run_id,
    state: kind,
    ...(state.kind === "ended" ? { ended: { status: state.endedStatus } } : {}),
    ...(state.kind === "paused" ? { paused: { reason: state.pausedReason } } : {}),
    ...(waiting ? { decision: waiting } : {}),
    ...(host ? { host } : {}),
    steps: [...closes, ...steps],
    slots,
    spawn_formats: formats,
    hint,
    ...(resumedPid !== null ? { resumed_pid: resumedPid } : {}),
    warnings,
  };
  const human = [
    `run ${spec.run_id}: ${kind}${state.kind === "ended" ? ` (${state.endedStatus})` : ""}`,
    ...closes.map((c) => `  close_agent(target=${c.agent_id})`),
    ...steps.map((s) => `  ${s.action} ${s.op} (${s.role}): ${s.host_call.tool}, then ${s.host_call.after}`),
    ...warnings.map((w) => `warning: ${w}`),
    hint,
  ].join("\n");
  print(values.json, answer, human);
  return EXIT_OK;
}

/** When the holder took its process lock (the lock file's time), or null when it names none. */
function processLockTakenAt(dir: string, started: LightRow): number | null {
  if (typeof started.process !== "string") return null;
  try {
    return statSync(join(dir, `process.${started.process}.lock`)).mtimeMs;
  } catch {
    return null;
  }
}

function spawnFormats(state: RunState, store: RoleTable | null): unknown[] {
  if (state.kind === "starting") return [];
  const pins = state.holderStarted?.role_pairs as
    | Record<string, { model: string | null; effort: string | null }>
    | undefined;
  const out: unknown[] = [];
  if (!store) return out;
  for (const role of ROLE_NAMES) {
    const entry = store.roles[role as RoleName];
    const pair = pins?.[role] ?? entry;
    out.push(spawnFormat(role, { ...entry, model: pair.model, effort: pair.effort }));
  }
  return out;
}

function stepOut(s: StepFile, crw: string, runId: string, stateFlag: string) {
  const args: Record<string, unknown> =
    s.action === "spawn"
      ? {
          agent_type: s.agent_type,
          message: s.message,
          ...(s.model ? { model: s.model } : {}),
          ...(s.reasoning_effort ? { reasoning_effort: s.reasoning_effort } : {}),
          fork_context: false,
        }
      : { target: s.agent_id, message: s.message };
  const agent = s.action === "spawn" ? "<agent_id from spawn_agent>" : s.agent_id;
  return {
    call: s.call,
    k: s.k,
    attempt: s.attempt,
    op: s.op,
    role: s.role,
    action: s.action,
    agent_type: s.agent_type,
    model: s.model,
    reasoning_effort: s.reasoning_effort,
    message: s.message,
    packet: s.packet,
    workspace: s.workspace,
    agent_id: s.agent_id,
    host_call: {
      tool: s.action === "spawn" ? "spawn_agent" : "send_input",
      arguments: args,
      after: `${crw} flow dispatched ${runId} ${s.call} --agent ${agent} --k ${s.k} --attempt ${s.attempt}${stateFlag} --json`,
    },
  };
}

function hintFor(
  kind: string,
  steps: number,
  closes: Array<{ agent_id: string }>,
  open: string[],
  full: boolean,
  resumedPid: number | null,
  crw: string,
  runId: string,
  stateFlag: string,
  waitMs: number,
): string {
  const next = `${crw} flow next ${runId}${stateFlag} --wait 10 --json`;
  const parts: string[] = [];
  if (resumedPid !== null) parts.push(`No process held the run: it was resumed (resumed_pid ${resumedPid}).`);
  if (kind === "ended") {
    // a cancelled run leaves its stopped calls' subagents to close
    if (closes.length > 0)
      parts.push(`Close: ${closes.map((c) => `close_agent(${c.agent_id})`).join(", ")}.`);
    return `${parts.join(" ")} The run has ended; nothing more to do.`.trim();
  }
  if (kind === "waiting_decision")
    return `The run waits for a decision: read it with ${crw} flow show ${runId}${stateFlag}, then run ${crw} flow answer ${runId} DECISION ANSWER${stateFlag}.`;
  if (kind === "paused")
    return `The run is paused; run ${crw} flow resume ${runId}${stateFlag} --detach when its cause is fixed.`;
  if (kind === "starting") {
    return `${parts.join(" ")} The run is starting; ask again ${waitMs > 0 ? "when its state changes" : "now"}: ${next}`.trim();
  }
  if (closes.length > 0)
    parts.push(`Close first: ${closes.map((c) => `close_agent(${c.agent_id})`).join(", ")}.`);
  if (full && steps > 0)
    parts.push("Agent thread limit reached: the step stays; close a finished subagent first.");
  else if (steps > 0) parts.push("Make each step's host call, then run its dispatched command.");
  if (open.length > 0) {
    parts.push(`Alternate wait_agent(targets=${JSON.stringify(open)}, timeout_ms=30000) with ${next}.`);
  } else parts.push(`Then: ${next}`);
  return parts.join(" ");
}
