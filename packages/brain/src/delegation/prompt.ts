import type { SessionRow } from "@crw/db";
import { composeInteractivePrompt, composeWorkerPrompt } from "../agent/index.js";
import {
  type DelegatedExecutionScope,
  eligibleInstructionFiles,
  instructionRootFor,
  instructionSection,
  parseDelegatedExecutionScope,
} from "../scope/index.js";

/** What a prompt says of a tool: its name and one-line description. */
export interface PromptTool {
  readonly name: string;
  readonly description: string;
}

/**
 * The system prompt of a session's turn, composed from durable state only (so a recovered turn gets the
 * same bytes): a fresh delegated worker gets the worker persona with its scope's role and context; a root
 * session the interactive prompt; a fork the prompt of the session it was forked from, byte for byte.
 */
export async function systemPromptFor(
  session: SessionRow,
  scope: DelegatedExecutionScope | null,
  tools: readonly PromptTool[],
  parentOf: (session: SessionRow) => Promise<SessionRow>,
  projectRootOf?: (ref: string) => Promise<string | undefined>,
): Promise<string> {
  const own = scope ?? (session.scope ? parseDelegatedExecutionScope(session.scope) : null);
  if (own?.fork && session.parentSessionId) {
    const parent = await parentOf(session);
    const parentScope = parent.scope ? parseDelegatedExecutionScope(parent.scope) : null;
    return systemPromptFor(parent, parentScope, tools, parentOf, projectRootOf);
  }
  const instructions = own ? await projectInstructionsOf(own, projectRootOf) : undefined;
  const inputs = {
    model: { id: session.model },
    tools: tools.map((t) => ({ name: t.name, description: t.description })),
    ...(own?.role ? { role: own.role } : {}),
    ...(own?.context ? { context: own.context } : {}),
    ...(instructions ? { projectInstructions: instructions } : {}),
  };
  return session.kind === "delegated" ? composeWorkerPrompt(inputs) : composeInteractivePrompt(inputs);
}

/**
 * The project instructions of a host placement under the owner-ancestor rule, read from its instruction
 * root (a linked worktree's own root, kept inside a registered project's root). Other targets read their
 * instructions on their own side; an unreadable placement composes without them.
 */
async function projectInstructionsOf(
  scope: DelegatedExecutionScope,
  projectRootOf?: (ref: string) => Promise<string | undefined>,
): Promise<string | undefined> {
  if (!scope.workDir || scope.target.kind !== "host") return undefined;
  try {
    const projectRoot = scope.target.ref ? await projectRootOf?.(scope.target.ref) : undefined;
    const root = await instructionRootFor(scope.workDir, projectRoot ?? null);
    return instructionSection(root, await eligibleInstructionFiles(scope.workDir, root));
  } catch {
    return undefined;
  }
}
