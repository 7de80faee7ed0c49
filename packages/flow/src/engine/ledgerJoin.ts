import { existsSync } from "node:fs";
import { spawnsOfOp } from "../bound/join.js";
import { ledgerFile, readLedger } from "../bound/ledger.js";
import type { HostItem } from "../host/sessionHost.js";

/**
 * After a restart, the subagents of a published step the spawn hook's ledger names: its lines of the
 * step's op (the marker on the spawn's first line) joined with the owner turn's collabAgentToolCall spawn
 * items by tool call id. Finds a spawn whose prompt the host does not show with the marker. An owner with
 * no ledger, or one that cannot be read, adds nothing.
 */
export function ledgerSpawnsOf(
  state: string,
  owner: string,
  items: readonly HostItem[],
  marker: string,
): string[] {
  try {
    if (!existsSync(ledgerFile(state, owner))) return [];
    return spawnsOfOp(readLedger(state, owner), items, marker).map((s) => s.agentId);
  } catch {
    return [];
  }
}
