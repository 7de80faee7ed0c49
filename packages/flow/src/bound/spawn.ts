import { type HelperPair, type HelperRole, isHelperRole, type OrchestratorLine, pairOf } from "./line.js";

/**
 * The spawn hook's decision, a pure function of the PreToolUse input and the owner's binding. It refuses
 * two spawns: one by a subagent (a leaf) and a full-history fork (fork_context: the fork would keep the
 * parent's pair). Every other spawn is allowed with model and reasoning_effort overwritten from the
 * decided parts of its role's pair: an undecided effort keeps the reasoning_effort the spawn was sent, an
 * undecided role keeps the whole spawn (role_undecided). The role is the one the first `CRW-ROLE:` line of
 * the message header names when it is exactly one of the six, else the role of the agent_type (worker is
 * executor), else explorer. This header parser is the flow-bound path's own.
 */

/** The PreToolUse hook's stdin as the pinned codex sends it (codex-host.md); only what is read. */
export interface PreToolUseInput {
  session_id: string;
  turn_id?: string;
  transcript_path?: string;
  cwd?: string;
  hook_event_name: string;
  tool_name: string;
  tool_input: Record<string, unknown>;
  tool_use_id?: string;
}

export type SpawnWarning =
  | "role_undecided"
  | "role_agent_type_mismatch"
  | "unrecorded_spawn"
  | "unrecorded_author";
export type RefusalReason = "leaf_spawn_refused" | "full_history_fork_refused";

export interface SpawnDecision {
  decision: "allow" | "deny";
  reason: RefusalReason | null;
  message: string;
  role: HelperRole;
  roleFrom: "header" | "agent_type" | "default";
  op: string | null;
  agentType: string | null;
  sent: { model: string | null; effort: string | null };
  /** What the spawn runs with when allowed. */
  applied: { model: string | null; effort: string | null };
  pair: HelperPair;
  warnings: SpawnWarning[];
  /** The tool input to run with, or null to leave the spawn as it was sent. */
  updatedInput: Record<string, unknown> | null;
}

/** The agent type each role is spawned as: executor-t1 as executor, critic as reviewer, the others by name. */
export const ROLE_AGENT_TYPE: Record<HelperRole, string> = {
  architect: "architect",
  executor: "executor",
  "executor-t1": "executor",
  reviewer: "reviewer",
  explorer: "explorer",
  critic: "reviewer",
};

const AUTHOR_TYPES = new Set(["executor", "architect", "worker"]);

export function parseHookInput(text: string): PreToolUseInput {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new TypeError("the hook's stdin is not JSON");
  }
  const o = raw as Record<string, unknown>;
  if (typeof o !== "object" || o === null) throw new TypeError("the hook's stdin is not an object");
  if (typeof o.session_id !== "string" || o.session_id === "")
    throw new TypeError("the hook's stdin has no session_id");
  if (typeof o.tool_name !== "string") throw new TypeError("the hook's stdin has no tool_name");
  const toolInput = o.tool_input ?? {};
  if (typeof toolInput !== "object" || toolInput === null || Array.isArray(toolInput))
    throw new TypeError("the hook's tool_input is not an object");
  const str = (v: unknown) => (typeof v === "string" ? v : undefined);
  const input: PreToolUseInput = {
    session_id: o.session_id,
    hook_event_name: str(o.hook_event_name) ?? "",
    tool_name: o.tool_name,
    tool_input: toolInput as Record<string, unknown>,
  };
  for (const key of ["turn_id", "transcript_path", "cwd", "tool_use_id"] as const) {
    const v = str(o[key]);
    if (v !== undefined) input[key] = v;
  }
  return input;
}

/** spawn_agent, with or without the multi-agent namespace the tool is listed under. */
export function isSpawnTool(toolName: string): boolean {
  return (
    toolName === "spawn_agent" || /(^|[._:])spawn_agent$/.test(toolName) || toolName.endsWith("v1spawn_agent")
  );
}

/** The spawn's text: its message, else its text items. */
export function spawnText(toolInput: Record<string, unknown>): string {
  if (typeof toolInput.message === "string") return toolInput.message;
  const items = Array.isArray(toolInput.items) ? toolInput.items : [];
  return items
    .map((i) =>
      i && typeof i === "object" && typeof (i as { text?: unknown }).text === "string"
        ? (i as { text: string }).text
        : "",
    )
    .filter((t) => t !== "")
    .join("\n");
}

/** The op of the message's `crw-flow-op:` first line, or null. */
export function opOf(text: string): string | null {
  const first = text.split("\n", 1)[0] ?? "";
  const m = /^crw-flow-op:[ \t]*(\S+)[ \t]*\r?$/.exec(first);
  return m?.[1] ?? null;
}

/** The role the first CRW-ROLE: line of the header (the lines before the first blank line) names, if one of the six. */
export function headerRole(text: string): HelperRole | null {
  for (const line of text.split("\n")) {
    if (line.trim() === "") return null;
    const m = /^CRW-ROLE:(.*)$/.exec(line);
    if (m) {
      const value = (m[1] ?? "").trim();
      return isHelperRole(value) ? value : null;
    }
  }
  return null;
}

export function agentTypeRole(agentType: string | null): HelperRole | null {
  if (agentType === null) return null;
  if (agentType === "worker") return "executor";
  return isHelperRole(agentType) ? agentType : null;
}

export function decideSpawn(
  input: PreToolUseInput,
  line: OrchestratorLine,
  facts: { spawnedBySubagent: boolean },
): SpawnDecision {
  const ti = input.tool_input;
  const text = spawnText(ti);
  const op = opOf(text);
  const agentType = typeof ti.agent_type === "string" && ti.agent_type !== "" ? ti.agent_type : null;
  const fromHeader = headerRole(text);
  const fromType = agentTypeRole(agentType);
  const role: HelperRole = fromHeader ?? fromType ?? "explorer";
  const roleFrom = fromHeader ? "header" : fromType ? "agent_type" : "default";
  const sent = {
    model: typeof ti.model === "string" && ti.model !== "" ? ti.model : null,
    effort:
      typeof ti.reasoning_effort === "string" && ti.reasoning_effort !== "" ? ti.reasoning_effort : null,
  };
  const pair = pairOf(line, role);
  const warnings: SpawnWarning[] = [];
  if (fromHeader && agentType !== null && agentType !== ROLE_AGENT_TYPE[fromHeader])
    warnings.push("role_agent_type_mismatch");
  if (op === null)
    warnings.push(
      agentType !== null && AUTHOR_TYPES.has(agentType) ? "unrecorded_author" : "unrecorded_spawn",
    );
  const base = { role, roleFrom, op, agentType, sent, pair } as const;
  if (facts.spawnedBySubagent) {
    return {
      ...base,
      decision: "deny",
      reason: "leaf_spawn_refused",
      message: "leaf_spawn_refused: a subagent of a crw flow run is a leaf and never spawns agents",
      applied: sent,
      warnings,
      updatedInput: null,
    };
  }
  if (ti.fork_context === true) {
    return {
      ...base,
      decision: "deny",
      reason: "full_history_fork_refused",
      message:
        "full_history_fork_refused: a full-history fork keeps the parent's model and effort; spawn with fork_context=false",
      applied: sent,
      warnings,
      updatedInput: null,
    };
  }
  if (pair.model === undefined) {
    warnings.unshift("role_undecided");
    return {
      ...base,
      decision: "allow",
      reason: null,
      message: `role ${role} is undecided: the spawn is kept as sent`,
      applied: sent,
      warnings,
      updatedInput: null,
    };
  }
  const applied = { model: pair.model, effort: pair.effort ?? sent.effort };
  const updatedInput: Record<string, unknown> = { ...ti, model: pair.model };
  if (pair.effort !== undefined) updatedInput.reasoning_effort = pair.effort;
  return {
    ...base,
    decision: "allow",
    reason: null,
    message: `role ${role}: model ${applied.model}, effort ${applied.effort ?? "(as sent)"}`,
    applied,
    warnings,
    updatedInput,
  };
}

/** The hookSpecificOutput codex reads (codex-host.md), or null when the spawn is left as sent. */
export function hookOutput(decision: SpawnDecision): Record<string, unknown> | null {
  if (decision.decision === "deny") {
    return {
      hookSpecificOutput: {
        hookEventName: "PreToolUse",
        permissionDecision: "deny",
        permissionDecisionReason: decision.message,
      },
    };
  }
  if (decision.updatedInput === null) return null;
  return {
    hookSpecificOutput: {
      hookEventName: "PreToolUse",
      permissionDecision: "allow",
      updatedInput: decision.updatedInput,
    },
  };
}
