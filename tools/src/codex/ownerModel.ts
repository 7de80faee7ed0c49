import {
  functionOutputs,
  type ModelReply,
  type ModelRequest,
  toolNamespace,
  userTexts,
} from "./mockModel.js";

/**
 * The owner of a crw flow session run, played by the mock model inside the real Codex: everything goes
 * through Codex's own tools, as a real owner model would do it. It starts the run with `crw flow start`
 * (exec_command; CODEX_THREAD_ID names the owner), then loops: `crw flow next --json`, for each step the
 * host call it names (spawn_agent / send_input / close_agent, arguments as given), then the step's
 * `dispatched` command; `next` again until the run has ended, then a final message with the run's state.
 * The commands use absolute paths (exec_command runs a login shell, which resets PATH).
 */

export interface OwnerModelOptions {
  /** The absolute command line of the start (e.g. `/usr/bin/node /repo/apps/crw/bin/crw.mjs flow start …`). */
  startCommand: string;
  /** Seconds for `next --wait` (the exec call waits up to 30 s for a command). */
  nextWaitSeconds?: number;
  /** Called with every decision, for a test's log. */
  log?: (line: string) => void;
}

interface PendingStep {
  tool: string;
  arguments: Record<string, unknown>;
  after: string | null;
}

/** A step's host call as `crw flow next --json` prints it. */
interface HostCallOut {
  tool: string;
  arguments: Record<string, unknown>;
  after?: string;
}

export interface OwnerModelState {
  runId: string | null;
  nextCommand: string | null;
  finalState: Record<string, unknown> | null;
  replies: Array<Record<string, unknown>>;
  nexts: number;
  hostCalls: Array<{ tool: string; arguments: Record<string, unknown> }>;
  /** Why the owner gave up, when it did. */
  failure: string | null;
  /** The processes `next` started for a run no process held (its `resumed_pid`). */
  resumedPids: number[];
}

/**
 * The command output's JSON object (one line or pretty-printed): the longest tail of the exec output,
 * starting at a line that opens with "{", that parses; else the last line that parses alone.
 */
export function commandJson(output: string): Record<string, unknown> | null {
  const body = output.includes("\nOutput:\n") ? output.slice(output.indexOf("\nOutput:\n") + 9) : output;
  const lines = body.split("\n");
  for (let i = 0; i < lines.length; i++) {
    if (!lines[i]?.startsWith("{")) continue;
    try {
      const value = JSON.parse(lines.slice(i).join("\n")) as unknown;
      if (value && typeof value === "object" && !Array.isArray(value))
        return value as Record<string, unknown>;
    } catch {}
  }
  for (const line of [...lines].reverse()) {
    const text = line.trim();
    if (!text.startsWith("{")) continue;
    try {
      return JSON.parse(text) as Record<string, unknown>;
    } catch {}
  }
  return null;
}

export function ownerModel(options: OwnerModelOptions): {
  handler: (request: ModelRequest) => ModelReply;
  state: OwnerModelState;
} {
  const write = options.log ?? (() => {});
  const t0 = Date.now();
  const log = (line: string) => write(`+${Date.now() - t0}ms ${line}`);
  const wait = options.nextWaitSeconds ?? 5;
  const state: OwnerModelState = {
    runId: null,
    nextCommand: null,
    finalState: null,
    replies: [],
    nexts: 0,
    hostCalls: [],
    failure: null,
    resumedPids: [],
  };
  /** Host calls still to make from the last `next`, each followed by its dispatched command. */
  const queue: PendingStep[] = [];
  /** What the last call was for, by call id. */
  const purposes = new Map<string, { purpose: string; step?: PendingStep }>();
  let counter = 0;

  const exec = (cmd: string, purpose: "start" | "next" | "dispatched"): ModelReply => {
    const callId = `crw_${purpose}_${++counter}`;
    purposes.set(callId, { purpose });
    log(`exec ${purpose}: ${cmd}`);
    return {
      items: [
        {
          type: "function_call",
          name: "exec_command",
          callId,
          arguments: { cmd, yield_time_ms: 30_000, max_output_tokens: 60_000 },
        },
      ],
    };
  };

  const next = (): ModelReply => {
    state.nexts++;
    return exec(`${state.nextCommand} --wait ${wait}`.replace(" --wait 10", ""), "next");
  };

  const hostCall = (request: ModelRequest, step: PendingStep): ModelReply => {
    const callId = `crw_host_${++counter}`;
    purposes.set(callId, { purpose: "host_call", step });
    state.hostCalls.push({ tool: step.tool, arguments: step.arguments });
    log(`host call ${step.tool} ${JSON.stringify(step.arguments).slice(0, 120)}`);
    return {
      items: [
        {
          type: "function_call",
          name: step.tool,
          namespace: toolNamespace(request, step.tool),
          callId,
          arguments: step.arguments,
        },
      ],
    };
  };

  const takeQueue = (request: ModelRequest): ModelReply => {
    const step = queue.shift();
    return step ? hostCall(request, step) : next();
  };

  const handler = (request: ModelRequest): ModelReply => {
    const last = functionOutputs(request).at(-1);
    // A new user turn (the first, or a wake) after the last tool output starts over from `next`; a
    // <subagent_notification> user message is no new turn.
    if (!last || newUserTurnAfter(request, last.callId)) {
      return state.runId ? next() : exec(options.startCommand, "start");
    }
    const done = purposes.get(last.callId);
    if (!done) return state.runId ? next() : exec(options.startCommand, "start");
    log(`${done.purpose} output: ${last.output.slice(0, 4_000)}`);
    switch (done.purpose) {
      case "start": {
        const answer = commandJson(last.output);
        if (!answer || typeof answer.run_id !== "string") {
          return {
            items: [{ type: "message", text: `start failed: ${last.output}`, phase: "final_answer" }],
          };
        }
        state.runId = answer.run_id;
        state.nextCommand = String(answer.next);
        return next();
      }
      case "next": {
        const answer = commandJson(last.output);
        if (!answer) return next();
        if (typeof answer.resumed_pid === "number") state.resumedPids.push(answer.resumed_pid);
        if (answer.state === "ended") {
          state.finalState = answer;
          return {
            items: [
              { type: "message", text: `run ended: ${JSON.stringify(answer.ended)}`, phase: "final_answer" },
            ],
          };
        }
        const steps = (answer.steps ?? []) as Array<{
          host_call?: HostCallOut;
          action?: string;
          agent_id?: string;
        }>;
        for (const step of steps) {
          if (step.action === "close" && step.agent_id) {
            queue.push({ tool: "close_agent", arguments: { target: step.agent_id }, after: null });
          } else if (step.host_call) {
            const after = step.host_call.after ?? null;
            queue.push({ tool: step.host_call.tool, arguments: step.host_call.arguments, after });
          }
        }
        return takeQueue(request);
      }
      case "host_call": {
        const step = done.step as PendingStep;
        if (!step.after) return takeQueue(request);
        let agent = typeof step.arguments.target === "string" ? step.arguments.target : "";
        if (step.tool === "spawn_agent") {
          const spawned = commandJson(last.output) as { agent_id?: string } | null;
          if (!spawned?.agent_id) {
            // A spawn the host refused: a real owner would stop and say so; so does this one.
            state.failure = `spawn_agent failed: ${last.output}`;
            return { items: [{ type: "message", text: state.failure, phase: "final_answer" }] };
          }
          agent = spawned.agent_id;
        }
        return exec(`${step.after.replace("<agent_id from spawn_agent>", agent)} --wait 30`, "dispatched");
      }
      case "dispatched": {
        const reply = commandJson(last.output);
        if (reply) state.replies.push(reply);
        return takeQueue(request);
      }
      default:
        return next();
    }
  };
  return { handler, state };
}

function newUserTurnAfter(request: ModelRequest, callId: string): boolean {
  const at = request.input.findIndex(
    (item) => item.type === "function_call_output" && item.call_id === callId,
  );
  return request.input.slice(at + 1).some((item) => {
    if (item.type !== "message" || item.role !== "user") return false;
    return !JSON.stringify(item.content ?? "").includes("<subagent_notification>");
  });
}

/** The marker and role a subagent's turn carries in its (last) user message. */
export function subagentTurn(request: ModelRequest): {
  marker: string | null;
  role: string | null;
  text: string;
} {
  const text = userTexts(request).at(-1) ?? "";
  const marker = /^crw-flow-op: (\S+)/m.exec(text)?.[1] ?? null;
  const role =
    /^CRW-ROLE: (\S+)/m.exec(userTexts(request).find((t) => t.includes("CRW-ROLE:")) ?? "")?.[1] ?? null;
  return { marker, role, text };
}
