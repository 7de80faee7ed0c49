import { randomUUID } from "node:crypto";
import type { TurnHost, TurnOutcome, TurnRequest, TurnTool } from "@crw/brain";
import { z } from "zod";
import { toError } from "./errors.js";
import { HOST_RPC_CLOSED_TEXT, HostRpcClosedError, HostRpcRemoteError } from "./hostRpc.js";
import type { RemoteError } from "./protocol/envelope.js";
import type { OutputFrame } from "./protocol/output.js";
import {
  drainSteeringAnswerSchema,
  type SessionTurnPayload,
  type TurnHostCall,
  type TurnRecord,
  toolOutputSchema,
} from "./protocol/sessionTurn.js";
import type { TapEvent } from "./protocol/turn.js";
import type { SessionTurnBackend } from "./sessionBackend.js";

interface PendingCall {
  readonly resolve: (value: unknown) => void;
  readonly reject: (error: Error) => void;
}

/**
 * Runner side of session turns: builds the seam's TurnRequest and TurnHost from a `sessionTurn` frame. The
 * TurnHost and every host tool are proxies whose calls go to the daemon as `turnHost` frames (records as
 * `turnRecord` frames, which are not answered); the model loop runs here. Calls have no deadline of their own: each is bounded by its turn (abort) and by the channel
 * (close rejects them all at once).
 */
export class RunnerSessionTurns {
  readonly #pending = new Map<string, PendingCall>();
  #closed = false;

  constructor(
    private readonly send: (frame: OutputFrame) => boolean,
    private readonly emit: (sessionId: string, event: TapEvent) => void,
  ) {}

  settle(requestId: string, result: { ok: unknown } | { error: RemoteError }): void {
    const p = this.#pending.get(requestId);
    if (!p) return;
    this.#pending.delete(requestId);
    if ("error" in result) p.reject(new HostRpcRemoteError(result.error));
    else p.resolve(result.ok);
  }

  close(): void {
    this.#closed = true;
    for (const [id, p] of [...this.#pending]) {
      this.#pending.delete(id);
      p.reject(new HostRpcClosedError(HOST_RPC_CLOSED_TEXT));
    }
  }

  #call<T>(turnId: string, call: TurnHostCall, answer: z.ZodType<T>): Promise<T> {
    if (this.#closed) return Promise.reject(new HostRpcClosedError(HOST_RPC_CLOSED_TEXT));
    const requestId = randomUUID();
    return new Promise<unknown>((resolve, reject) => {
      this.#pending.set(requestId, { resolve, reject });
      if (!this.send({ type: "turnHost", requestId, turnId, call })) {
        this.#pending.delete(requestId);
        reject(new HostRpcClosedError(HOST_RPC_CLOSED_TEXT));
      }
    }).then((raw) => answer.parse(raw));
  }

  async run(
    payload: SessionTurnPayload,
    backend: SessionTurnBackend,
    signal: AbortSignal,
  ): Promise<{
    stopReason: "stop" | "error" | "aborted";
    errorMessage?: string;
    text: string;
    record?: TurnRecord;
  }> {
    const { turnId, request: r } = payload;
    let text = "";
    // The newest record, not sent yet: the turn's next frame to the daemon takes it first, and when that is
    // the reply, the reply carries it (a frame fewer per turn). Records need no answer: the daemon writes
    // them in order, and any call after one (an intent, a drain, a host tool) waits for it there.
    let held: TurnRecord | undefined;
    const flush = (): void => {
      if (held === undefined) return;
      this.send({ type: "turnRecord", requestId: randomUUID(), turnId, record: held });
      held = undefined;
    };
    const call = <T>(c: TurnHostCall, answer: z.ZodType<T>): Promise<T> => {
      flush();
      return this.#call(turnId, c, answer);
    };
    const nullAnswer = z.null();
    const tools: TurnTool[] = r.tools.map((decl) => ({
      name: decl.name,
      description: decl.description,
      parameters: decl.parameters,
      execute: (args, ctx) =>
        call(
          { op: "executeTool", toolName: decl.name, toolCallId: ctx.toolCallId, args: { ...args } },
          toolOutputSchema,
        ),
    }));
    const request: TurnRequest = {
      sessionId: r.sessionId,
      principalAccountId: r.principalAccountId,
      model: r.model,
      systemPrompt: r.systemPrompt,
      context: r.context,
      tools,
      scope: backend.parseScope(r.scope),
      readOnly: r.readOnly,
      workDir: r.workDir,
      signal,
    };
    const host: TurnHost = {
      record: async (message, meta) => {
        if (this.#closed) throw new HostRpcClosedError(HOST_RPC_CLOSED_TEXT);
        flush();
        // The response's usage travels with its journal write (the row's own record); the per-response
        // accounting is the separate `providerUsage` frame.
        const usage = message.role === "assistant" ? meta?.usage : undefined;
        held = { message, ...(usage && { usage }) };
        if (message.role === "assistant") {
          text = message.content.flatMap((c) => (c.type === "text" ? [c.text] : [])).join("");
        }
        if (message.role === "toolResult") {
          this.emit(r.sessionId, {
            kind: "tool",
            turnId,
            name: message.toolName,
            phase: "end",
            result: message.content,
          });
        }
      },
      beforeToolCall: async (toolCall) => {
        await call({ op: "beforeToolCall", call: toolCall }, nullAnswer);
        this.emit(r.sessionId, { kind: "tool", turnId, name: toolCall.name, phase: "start" });
      },
      drainSteering: () => call({ op: "drainSteering" }, drainSteeringAnswerSchema),
      progress: (event) => {
        if (event.type === "text") this.emit(r.sessionId, { kind: "text", turnId, text: event.text });
        // What the daemon hears of the turn comes after the records before it (a tool's start after the
        // assistant message that called it).
        flush();
        this.send({ type: "turnProgress", requestId: randomUUID(), turnId, event });
      },
    };
    let outcome: TurnOutcome;
    try {
      outcome = await backend.runner(payload.runner).runTurn(request, host);
    } catch (e) {
      flush();
      throw toError(e);
    }
    return {
      stopReason: outcome.stopReason,
      ...(outcome.errorMessage !== undefined && { errorMessage: outcome.errorMessage }),
      text,
      ...(held !== undefined && { record: held }),
    };
  }
}
