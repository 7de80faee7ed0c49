import { randomUUID } from "node:crypto";
import {
  captureDelegatedExecutionScope,
  createScriptedTurnRunner,
  parseDelegatedExecutionScope,
  type SessionTurnRunner,
  type TurnHost,
  type TurnRequest,
  type TurnTool,
} from "@crw/brain";

/** A delegated child's session turn (it carries its durable scope), as the delegation core hands it over. */
export function childTurn(
  sessionId: string = randomUUID(),
  partial: { task?: string; tools?: TurnTool[]; signal?: AbortSignal; parentSessionId?: string } = {},
): TurnRequest {
  return {
    sessionId,
    principalAccountId: "acct-1",
    model: "scripted",
    systemPrompt: "You are a worker.",
    context: [{ role: "user", content: partial.task ?? "hi" }],
    tools: partial.tools ?? [],
    scope: parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({ accountId: "acct-1", target: { kind: "host", ref: null } }),
    ),
    readOnly: false,
    workDir: null,
    signal: partial.signal ?? new AbortController().signal,
    ...(partial.parentSessionId !== undefined && { parentSessionId: partial.parentSessionId }),
  };
}

/** A TurnHost that journals nothing, counting what it was asked to record. */
export function quietHost(): TurnHost & { recorded: number } {
  const host = {
    recorded: 0,
    record: async () => {
      host.recorded++;
    },
    beforeToolCall: async () => {},
    drainSteering: async () => [],
    progress: () => {},
  };
  return host;
}

/**
 * The daemon's own SessionTurnRunner (brain's scripted one), writing down each turn it ran in the daemon;
 * `nested` runs inside that turn (a child delegating from its own turn).
 */
export function daemonRunner(log: string[] = [], nested?: (request: TurnRequest) => Promise<void>) {
  const ran: string[] = [];
  const scripted = createScriptedTurnRunner();
  const runner: SessionTurnRunner = {
    runTurn: async (request, host) => {
      ran.push(request.sessionId);
      log.push(`run ${request.sessionId}`);
      await nested?.(request);
      return scripted.runTurn(request, host);
    },
  };
  return { runner, ran };
}
