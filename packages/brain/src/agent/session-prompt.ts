import type { DelegatedExecutionScope } from "../scope/index.js";
import {
  composeInteractivePrompt,
  composeWorkerPrompt,
  type PromptFragment,
  selectPromptRoute,
  type ToolSummary,
} from "./prompt.js";
import { childToolSummaries } from "./tools.js";

export interface SessionPromptOptions {
  /** The session's durable scope; `null` for a root (interactive) session. */
  readonly scope: DelegatedExecutionScope | null;
  readonly model: { readonly id: string; readonly provider?: string };
  /** Host tools the session gets beside its child tools (Delegate and friends). */
  readonly hostTools?: readonly ToolSummary[];
  readonly fragments?: readonly PromptFragment[];
  readonly accountInstructions?: string;
  /** Interactive sessions only; a worker never gets them. */
  readonly recalledMemories?: readonly string[];
  /** The per-call read-only clamp, which hides the writing tools from the catalog. */
  readonly readOnly?: boolean;
}

/**
 * The system prompt a session's turns use: a fresh worker's composition for a delegated child, the
 * interactive composition for a root session, and `undefined` for a fork, which must continue with its
 * parent's byte-identical prefix instead. The tool catalog lists exactly what the scope lets the model see.
 */
export function sessionSystemPrompt(options: SessionPromptOptions): string | undefined {
  const { scope } = options;
  const route = selectPromptRoute(
    scope ? { fork: scope.fork === true, purpose: "delegate" } : { purpose: "interactive" },
  );
  if (route === "fork") return undefined;
  const childTools = scope?.workDir
    ? childToolSummaries({
        workDir: scope.workDir,
        scope,
        ...(options.readOnly !== undefined ? { readOnly: options.readOnly } : {}),
      })
    : [];
  const hostNames = new Set((options.hostTools ?? []).map((t) => t.name));
  const inputs = {
    model: options.model,
    tools: [...childTools.filter((t) => !hostNames.has(t.name)), ...(options.hostTools ?? [])],
    ...(options.fragments ? { fragments: options.fragments } : {}),
    ...(scope?.role ? { role: scope.role } : {}),
    ...(scope?.context ? { context: scope.context } : {}),
    ...(options.accountInstructions ? { accountInstructions: options.accountInstructions } : {}),
  };
  if (route === "worker") return composeWorkerPrompt(inputs);
  return composeInteractivePrompt({
    ...inputs,
    ...(options.recalledMemories ? { recalledMemories: options.recalledMemories } : {}),
  });
}
