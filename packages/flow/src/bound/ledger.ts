import { closeSync, fsyncSync, mkdirSync, openSync, readFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import type { SpawnDecision } from "./spawn.js";
import { boundDir, checkOwnerId, checkTrusted } from "./store.js";

/**
 * The spawn hook's ledger: `<state>/flow-bound/decisions/<owner>.jsonl`, one line per decision, appended
 * and fsync'd before the hook answers (the run joins the ledger's op with the owner turn's
 * collabAgentToolCall items to find a published step's subagent after a restart, session-host.md).
 */
export interface LedgerLine {
  v: 1;
  at: string;
  owner: string;
  run_id: string;
  policyDigest: string;
  tool_use_id: string | null;
  turn_id: string | null;
  decision: "allow" | "deny";
  reason: string | null;
  role: string;
  role_from: string;
  op: string | null;
  agent_type: string | null;
  sent: { model: string | null; effort: string | null };
  applied: { model: string | null; effort: string | null };
  warnings: string[];
}

export function ledgerFile(state: string, owner: string): string {
  return join(boundDir(state), "decisions", `${checkOwnerId(owner)}.jsonl`);
}

export function ledgerLine(
  decision: SpawnDecision,
  context: {
    owner: string;
    runId: string;
    policyDigest: string;
    toolUseId?: string;
    turnId?: string;
    at?: Date;
  },
): LedgerLine {
  return {
    v: 1,
    at: (context.at ?? new Date()).toISOString(),
    owner: context.owner,
    run_id: context.runId,
    policyDigest: context.policyDigest,
    tool_use_id: context.toolUseId ?? null,
    turn_id: context.turnId ?? null,
    decision: decision.decision,
    reason: decision.reason,
    role: decision.role,
    role_from: decision.roleFrom,
    op: decision.op,
    agent_type: decision.agentType,
    sent: decision.sent,
    applied: decision.decision === "allow" ? decision.applied : { model: null, effort: null },
    warnings: decision.warnings,
  };
}

/** Appends one line durably. Throws when it cannot: the hook then allows the spawn and says so. */
export function appendLedger(state: string, line: LedgerLine): void {
  const dir = join(boundDir(state), "decisions");
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  checkTrusted(dir, "dir");
  const fd = openSync(ledgerFile(state, line.owner), "a", 0o600);
  try {
    writeSync(fd, `${JSON.stringify(line)}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** The ledger's lines (a torn last line is left out): what the run joins with the owner's spawns. */
export function readLedger(state: string, owner: string): LedgerLine[] {
  let text: string;
  try {
    text = readFileSync(ledgerFile(state, owner), "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw e;
  }
  const end = text.lastIndexOf("\n") + 1;
  return text
    .slice(0, end)
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as LedgerLine);
}
