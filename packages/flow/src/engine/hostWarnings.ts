import { existsSync } from "node:fs";
import { ledgerFile, readLedger } from "../bound/ledger.js";
import type { HostThread } from "../host/sessionHost.js";
import type { Step } from "./publishStep.js";
import type { RunContext } from "./runContext.js";

/**
 * What the marker search could not tie as it should, for a subagent it found by a step's marker: the
 * owner's spawn item of that subagent has no line in the spawn hook's ledger (no_ledger_line), or the
 * ledger line names another op than the step's marker (ledger_op_differs). An owner whose spawns no hook
 * decided (no ledger file) has nothing to tie, and a ledger or owner that cannot be read judges nothing.
 * The caller writes them as a session_host_warning row; several_spawns is the lookup's own.
 */
export async function ledgerWarnings(
  rc: RunContext,
  step: Step,
  thread: HostThread,
): Promise<Array<"no_ledger_line" | "ledger_op_differs">> {
  let lines: ReturnType<typeof readLedger>;
  try {
    if (!existsSync(ledgerFile(rc.paths.state, rc.owner))) return [];
    lines = readLedger(rc.paths.state, rc.owner);
  } catch {
    return [];
  }
  const owner = await rc.host.readThread(rc.owner);
  if (!owner.ok) return [];
  const itemIds = new Set<string>();
  for (const turn of owner.value.turns) {
    for (const item of turn.items) {
      if (
        item.type === "collabAgentToolCall" &&
        item.tool === "spawnAgent" &&
        item.receiverThreadIds.includes(thread.id)
      )
        itemIds.add(item.id);
    }
  }
  const line = lines.find((l) => l.tool_use_id !== null && itemIds.has(l.tool_use_id));
  if (!line) return ["no_ledger_line"];
  return line.op === step.marker ? [] : ["ledger_op_differs"];
}
