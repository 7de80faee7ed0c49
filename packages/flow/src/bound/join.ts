import type { LedgerLine } from "./ledger.js";

/**
 * The join the run makes after a restart to find the subagent of a published step: the hook's ledger line
 * of the step's op (the crw-flow-op: first line of the spawn) and the owner turn's collabAgentToolCall
 * spawn item of the same tool call (the item's id is the tool call's id, the ledger's tool_use_id). A
 * refused spawn has no subagent. Several allowed spawns of one op are all answered, newest last: the caller
 * decides (the adapter's several_spawns warning).
 */
export interface CollabSpawnItem {
  type: "collabAgentToolCall";
  id: string;
  tool: string;
  receiverThreadIds: string[];
}

export interface OpSpawn {
  op: string;
  toolUseId: string;
  agentId: string;
  ledger: LedgerLine;
}

export function spawnsOfOp(
  ledger: readonly LedgerLine[],
  items: ReadonlyArray<{ type: string; id: string; tool?: string; receiverThreadIds?: string[] }>,
  op: string,
): OpSpawn[] {
  const byCall = new Map<string, string>();
  for (const item of items) {
    if (item.type !== "collabAgentToolCall" || item.tool !== "spawnAgent") continue;
    const agent = item.receiverThreadIds?.[0];
    if (agent) byCall.set(item.id, agent);
  }
  const out: OpSpawn[] = [];
  for (const line of ledger) {
    if (line.op !== op || line.decision !== "allow" || line.tool_use_id === null) continue;
    const agentId = byCall.get(line.tool_use_id);
    if (agentId) out.push({ op, toolUseId: line.tool_use_id, agentId, ledger: line });
  }
  return out;
}
