import type { HostThread, HostTurn } from "../host/sessionHost.js";
import type { RowOf } from "../journal/rows.js";
import type { RolePair } from "../run/roles.js";
import { markerInText } from "../steps/message.js";

/**
 * The binding rules. A subagent is the step's only when the host shows that it is the owner thread's
 * (parentThreadId), that one of its turns carries the step's marker in its first user message, and that it
 * runs the role's pair: only the decided parts are compared (an undecided role is pair_unchecked, a model
 * with an undecided effort is effort_unchecked and the host's effort is recorded as the call's pair).
 */
export type BindVerdict =
  | {
      verdict: "bind";
      turn: HostTurn;
      pairUnchecked: boolean;
      effortUnchecked: boolean;
      agentRoleMismatch: { expected: string; actual: string | null } | null;
    }
  | { verdict: "refused"; reason: string }
  | { verdict: "retry"; reason: string }
  | { verdict: "pair_mismatch"; reason: string; pair: RolePair };

/** The turn whose first user message carries the marker, if any. */
export function markerTurn(thread: HostThread, marker: string): HostTurn | null {
  for (const turn of thread.turns) {
    const first = turn.items.find((i) => i.type === "userMessage");
    if (first && first.type === "userMessage" && markerInText(first.text) === marker) return turn;
  }
  return null;
}

export function judgeBind(
  step: RowOf<"step_published">,
  thread: HostThread,
  owner: string,
  pair: RolePair,
): BindVerdict {
  if (thread.parentThreadId !== owner) {
    return {
      verdict: "refused",
      reason: `thread ${thread.id} is not a subagent of the owner thread ${owner}`,
    };
  }
  if (step.action === "send_input" && step.agent_id !== thread.id) {
    return { verdict: "refused", reason: `the step is for subagent ${step.agent_id}, not ${thread.id}` };
  }
  const turn = markerTurn(thread, step.marker);
  if (!turn)
    return { verdict: "retry", reason: `no turn of ${thread.id} carries the marker ${step.marker} yet` };
  if (pair.model !== null && thread.model !== pair.model) {
    return {
      verdict: "pair_mismatch",
      reason: `subagent runs model ${thread.model ?? "(unknown)"}; role ${step.role} runs ${pair.model}`,
      pair,
    };
  }
  if (pair.model !== null && pair.effort !== null && thread.reasoningEffort !== pair.effort) {
    return {
      verdict: "pair_mismatch",
      reason: `subagent runs effort ${thread.reasoningEffort ?? "(unknown)"}; role ${step.role} runs ${pair.effort}`,
      pair,
    };
  }
  const agentRoleMismatch =
    thread.agentRole !== step.agent_type ? { expected: step.agent_type, actual: thread.agentRole } : null;
  return {
    verdict: "bind",
    turn,
    pairUnchecked: pair.model === null,
    effortUnchecked: pair.model !== null && pair.effort === null,
    agentRoleMismatch,
  };
}
