import { type DelegatedExecutionScope, toolCallVerdict } from "../scope/index.js";
import { DelegationError } from "./errors.js";
import { faultPoint } from "./faults.js";
import type { TurnTool } from "./turn.js";

/** Marks a tool that changes something outside the transcript: refused in a read-only turn. */
export interface MutatingTool extends TurnTool {
  readonly mutates?: boolean;
}

/**
 * Wraps a turn's tools with the scope's ceiling: the allow-list, the deny-list (denial wins) and
 * read-only. A refused call is a typed error the model sees as its tool result; the tool never runs.
 */
export function scopedTools(
  tools: readonly MutatingTool[],
  scope: DelegatedExecutionScope | null,
  readOnly: boolean,
): TurnTool[] {
  return tools.map((tool) => ({
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
