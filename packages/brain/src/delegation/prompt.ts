import type { SessionRow } from "@crw/db";
import { composeInteractivePrompt, composeWorkerPrompt } from "../agent/index.js";
import { type DelegatedExecutionScope, parseDelegatedExecutionScope } from "../scope/index.js";
import type { TurnTool } from "./turn.js";

/**
 * The system prompt of a session's turn, composed from durable state only (so a recovered turn gets the
 * same bytes): a fresh delegated worker gets the worker persona with its scope's role and context; a root
 * session the interactive prompt; a fork the prompt of the session it was forked from, byte for byte.
 */
export async function systemPromptFor(
  session: SessionRow,
  scope: DelegatedExecutionScope | null,
  tools: readonly TurnTool[],
  parentOf: (session: SessionRow) => Promise<SessionRow>,
): Promise<string> {
  const own = scope ?? (session.scope ? parseDelegatedExecutionScope(session.scope) : null);
  if (own?.fork && session.parentSessionId) {
    const parent = await parentOf(session);
    const parentScope = parent.scope ? parseDelegatedExecutionScope(parent.scope) : null;
    return systemPromptFor(parent, parentScope, tools, parentOf);
  }
  const inputs = {
    model: { id: session.model },
    tools: tools.map((t) => ({ name: t.name, description: t.description })),
    ...(own?.role ? { role: own.role } : {}),
    ...(own?.context ? { context: own.context } : {}),
  };
  return session.kind === "delegated" ? composeWorkerPrompt(inputs) : composeInteractivePrompt(inputs);
}
