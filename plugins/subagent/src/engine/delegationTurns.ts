import { type DelegationService, parseDelegatedExecutionScope } from "@crw/brain";
import type { NodeTurnExecutor } from "./journalDispatcher.js";

/**
 * Node turns through the delegation core's own bracket (`DelegationService.runChildTurn`): the same session
 * turns, worker prompt composition, scoped tools, runner dispatch and journaling a Delegate call's child
 * gets. The node's child has no subagent run row: the workflow engine, not the delegation core, owns it.
 */
export function delegationNodeTurns(service: DelegationService): NodeTurnExecutor {
  return {
    async executeTurn(child, signal, onEvent) {
      const session = await service.repo.getSession(child.sessionId, child.principalAccountId);
      const scope = parseDelegatedExecutionScope(child.scope || session.scope || "");
      const { outcome, reply } = await service.runChildTurn(
        session,
        scope,
        (event) => {
          if (event.type === "text") onEvent?.({ type: "text", text: event.text });
          else if (event.type === "tool") onEvent?.({ type: "tool", name: event.toolName });
        },
        signal,
      );
      return {
        stopReason: outcome.stopReason,
        ...(outcome.errorMessage !== undefined ? { errorMessage: outcome.errorMessage } : {}),
        ...(reply !== undefined ? { reply } : {}),
      };
    },
  };
}
