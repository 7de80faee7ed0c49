import { dirname, join } from "node:path";
import type { JournalRow, RowOf } from "../journal/rows.js";
import type { RoleName } from "../run/roles.js";
import { FlowError } from "../util/errors.js";
import { writeFileAtomic } from "../util/fsx.js";
import type { RunContext } from "./runContext.js";
import { FlowCallError } from "./workflow.js";

/** One place of a call's conversation: the turn that holds it and the input it took. */
export interface ConversationTurn {
  call: string;
  place: number;
  turn_id: string;
  marker: string;
  input: string;
}

/**
 * A session call's conversation: its turns at the conversation_turn each turn_started records, each place
 * once; a later turn at a place (a turn run again, replaces_turn) supersedes the earlier one. A legacy
 * turn_started without conversation_turn takes its place from the repair member of the step_published at
 * its k (task turn 1, repair 2). Never read back from held rows or k alone.
 */
export function conversationOf(call: string, rows: readonly JournalRow[]): ConversationTurn[] {
  const steps = rows.filter((r): r is RowOf<"step_published"> => r.type === "step_published");
  const byPlace = new Map<number, ConversationTurn>();
  for (const t of rows) {
    if (t.type !== "turn_started") continue;
    const step = steps.find((s) => s.marker === t.marker);
    const place = t.conversation_turn ?? (steps.find((s) => s.k === t.k)?.repair ? 2 : 1);
    byPlace.set(place, { call, place, turn_id: t.turn_id, marker: t.marker, input: step?.input ?? "" });
  }
  return [...byPlace.values()].sort((a, b) => a.place - b.place);
}

/**
 * The journal's record of a handle's turns: for a call that itself continued another, the continued calls'
 * turns first, then its own conversation.
 */
export function recordOf(
  rc: Pick<RunContext, "rowsOf">,
  handle: string,
  seen = new Set<string>(),
): ConversationTurn[] {
  if (seen.has(handle)) return [];
  seen.add(handle);
  const rows = rc.rowsOf(handle);
  const prepared = rows.find((r): r is RowOf<"prepared"> => r.type === "prepared");
  const before = prepared?.input.resume ? recordOf(rc, prepared.input.resume.call, seen) : [];
  return [...before, ...conversationOf(handle, rows)];
}

/**
 * The continuation part of a call's input: the handle and its thread chain (the continued calls' subagents
 * first), so the input digest keeps the chain. The handle must have completed. Only the decided parts of
 * the continuing role's pair are compared with the pair the handle's subagent ran: a difference is
 * pair_refused (a call bound pair_unchecked or effort_unchecked continues on a new subagent like any other).
 */
export function continuationOf(
  rc: Pick<RunContext, "rowsOf" | "pins">,
  call: string,
  role: RoleName,
  handle: string,
  effort: string | null = null,
): { call: string; chain: string[] } {
  const rows = rc.rowsOf(handle);
  if (!rows.some((r) => r.type === "completed"))
    throw new FlowError(
      "workflow_invalid",
      `ctx.call: ${call} continues ${handle}, which has not completed (await it before continuing it)`,
      2,
    );
  const threads = rows.filter((r): r is RowOf<"thread_started"> => r.type === "thread_started");
  const last = threads.at(-1);
  const pin = rc.pins[role];
  if (last && pin.model) {
    if (last.model !== pin.model)
      throw new FlowCallError(
        call,
        `pair_refused: ${handle}'s subagent ran model ${last.model ?? "unknown"}, role ${role} decides ${pin.model}`,
      );
    if (pin.effort && last.effort !== pin.effort)
      throw new FlowCallError(
        call,
        `pair_refused: ${handle}'s subagent ran effort ${last.effort ?? "unknown"}, role ${role} decides ${pin.effort}`,
      );
  }
  if (effort !== null) {
    // an explicit effort: the role's when it decides one, else the effort the handle's subagent ran
    if (pin.effort !== null && effort !== pin.effort)
      throw new FlowCallError(call, `pair_refused: role ${role} decides effort ${pin.effort}, not ${effort}`);
    if (pin.effort === null && last && last.effort !== effort)
      throw new FlowCallError(
        call,
        `pair_refused: ${handle}'s subagent ran effort ${last.effort ?? "unknown"}, the continuation asks ${effort}`,
      );
  }
  const prepared = rows.find((r): r is RowOf<"prepared"> => r.type === "prepared");
  const before = prepared?.input.resume?.chain ?? [];
  return { call: handle, chain: [...before, ...threads.map((t) => t.thread_id)] };
}

/** The packet section of a continuation: the continued call's packet, a file with its answer, its turns. */
export function continuationSection(rc: RunContext, prepared: RowOf<"prepared">): string {
  const handle = prepared.input.resume?.call as string;
  const rows = rc.rowsOf(handle);
  const steps = rows.filter((r): r is RowOf<"step_published"> => r.type === "step_published");
  const packet = steps.at(-1)?.packet ?? null;
  const completed = rows.find((r): r is RowOf<"completed"> => r.type === "completed");
  const answerFile = join(dirname(packet ?? join(rc.paths.steps, handle, "x")), "answer.json");
  writeFileAtomic(answerFile, `${JSON.stringify(completed?.result ?? null, null, 2)}\n`, true);
  const out = [
    `## Continued call ${handle}`,
    "",
    `This call continues call ${handle}. You are a new subagent: read what it was given and what it answered before you start.`,
    "",
    `- Its packet: ${packet ?? "(none recorded)"}`,
    `- Its answer: ${answerFile}`,
    "",
    "### The record of its turns",
    "",
  ];
  for (const t of recordOf(rc, handle)) {
    out.push(
      `Call ${t.call}, conversation turn ${t.place} (${t.marker}), its input:`,
      "",
      "```text",
      t.input,
      "```",
      "",
    );
  }
  return out.join("\n");
}
