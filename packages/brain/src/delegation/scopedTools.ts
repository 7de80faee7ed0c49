import {
  type DelegatedExecutionScope,
  parseToolEntry,
  type ToolLists,
  toolCallVerdict,
} from "../scope/index.js";
import { DelegationError } from "./errors.js";
import { faultPoint } from "./faults.js";
import type { TurnTool } from "./turn.js";

/** Marks a tool that changes something outside the transcript: refused in a read-only turn. */
export interface MutatingTool extends TurnTool {
  readonly mutates?: boolean;
}

/**
 * Whether the scope's lists let any call of `tool` run, by the rule `scopedTools` applies to each call: a
 * tool that can never pass is left out of the turn, so a model never sees a tool it cannot call. For a tool
 * without a subject an argument pattern cannot be proved, so a matching denial refuses all of it and a
 * matching allowance none; for one with a subject only a pattern-free denial removes the whole tool.
 */
export function toolOffered(lists: ToolLists, tool: Pick<MutatingTool, "name" | "subject">): boolean {
  if (!tool.subject) return toolCallVerdict(lists, tool.name).ok;
  const nameOnly = (entry: string) => parseToolEntry(entry)?.name ?? "\0";
  if (
    lists.deny.some(
      (d) => parseToolEntry(d)?.arg === undefined && !toolCallVerdict({ deny: [d] }, tool.name).ok,
    )
  )
    return false;
  if (lists.allow === undefined) return true;
  return lists.allow.some((entry) => toolCallVerdict({ allow: [nameOnly(entry)], deny: [] }, tool.name).ok);
}

/** The tools of a turn the scope can let run (`toolOffered`); every tool when there is no scope. */
export function offeredTools<T extends MutatingTool>(
  tools: readonly T[],
  scope: DelegatedExecutionScope | null,
): T[] {
  return scope ? tools.filter((tool) => toolOffered(scope.tools, tool)) : [...tools];
}

/**
 * Wraps a turn's tools with the scope's ceiling: the allow-list, the deny-list (denial wins) and
 * read-only; a tool the scope can never let run is left out (`offeredTools`). A refused call is a typed
 * error the model sees as its tool result; the tool never runs.
 */
export function scopedTools(
  tools: readonly MutatingTool[],
  scope: DelegatedExecutionScope | null,
  readOnly: boolean,
): TurnTool[] {
  return offeredTools(tools, scope).map((tool) => ({
    ...tool,
    async execute(args, ctx) {
      if (readOnly && tool.mutates) {
        throw new DelegationError(
          "tool_not_allowed",
          `${tool.name} changes files and this turn is read-only`,
          {
            tool: tool.name,
          },
        );
      }
      if (scope) {
        const verdict = toolCallVerdict(scope.tools, tool.name, tool.subject?.(args));
        if (!verdict.ok) {
          throw new DelegationError(
            "tool_not_allowed",
            verdict.reason === "denied"
              ? `${tool.name} is denied by this session's scope (${verdict.entry})`
              : `${tool.name} is not in this session's allow-list`,
            { tool: tool.name, reason: verdict.reason },
          );
        }
      }
      const out = await tool.execute(args, ctx);
      faultPoint("tool.after_effect", tool.name);
      return out;
    },
  }));
}
