import { open } from "node:fs/promises";
import { runBashTool } from "./bashTool.js";
import type { ChildTurnContext, ChildTurnExecutor } from "./childTurn.js";
import type { DelegatedTurnRequest, DelegatedTurnResult } from "./protocol/turn.js";

export class ScriptedTurnError extends Error {
  override readonly name = "ScriptedTurnError";
  readonly retryable = false;
  constructor(
    message: string,
    readonly code: string,
  ) {
    super(message);
  }
}

/**
 * The offline scripted provider: runs a request's `script` step by step. Without a script it answers the
 * prompt with a fixed echo, so a turn always has a deterministic reply.
 */
export class ScriptedTurnExecutor implements ChildTurnExecutor {
  async runTurn(request: DelegatedTurnRequest, ctx: ChildTurnContext): Promise<DelegatedTurnResult> {
    const { turnId, sessionId } = request;
    const texts: string[] = [];
    const aborted = (): DelegatedTurnResult => ({
      turnId,
      sessionId,
      text: texts.join(""),
      stopReason: "aborted",
    });
    const script = request.script ?? [
      { kind: "text" as const, text: `done: ${request.prompt.slice(0, 200)}` },
    ];
    for (const step of script) {
      if (ctx.signal.aborted) return aborted();
      switch (step.kind) {
        case "text":
          texts.push(step.text);
          ctx.emit({ kind: "text", turnId, text: step.text });
          ctx.progress(step.text.slice(0, 120));
          break;
        case "reasoning":
          ctx.emit({ kind: "reasoning", turnId, text: step.text });
          break;
        case "tool": {
          ctx.emit({ kind: "tool", turnId, name: step.name, phase: "start" });
          // Bash is a real tool (local execution through the daemon); other names replay a scripted result.
          const result = step.name === "Bash" ? await runBashTool(ctx, step.args) : (step.result ?? "");
          ctx.emit({ kind: "tool", turnId, name: step.name, phase: "end", result });
          break;
        }
        case "wait":
          if (!(await sleep(step.ms, ctx.signal))) return aborted();
          break;
        case "hostRpc": {
          ctx.emit({ kind: "tool", turnId, name: step.method, phase: "start" });
          const answer = await ctx.hostRpc(step.method, step.params);
          ctx.emit({
            kind: "tool",
            turnId,
            name: step.method,
            phase: "end",
            result: JSON.stringify(answer ?? null),
          });
          break;
        }
        case "spawn": {
          ctx.emit({ kind: "tool", turnId, name: "spawn", phase: "start" });
          const pid = await ctx.spawn(step.command);
          ctx.emit({ kind: "tool", turnId, name: "spawn", phase: "end", result: String(pid) });
          break;
        }
        case "localExec": {
          if (!ctx.localExec) throw new ScriptedTurnError("no local execution here", "unsupported");
          const call = ctx.localExec(
            { op: "start", command: step.command, service: step.service },
            (event) => {
              if (event.kind === "stdout") ctx.emit({ kind: "text", turnId, text: event.data });
            },
          );
          ctx.emit({ kind: "tool", turnId, name: "localExec", phase: "start" });
          if (step.service) {
            const processId = await call.started;
            ctx.emit({
              kind: "tool",
              turnId,
              name: "localExec",
              phase: "end",
              result: `service ${processId}`,
            });
          } else {
            const final = await call.final;
            ctx.emit({
              kind: "tool",
              turnId,
              name: "localExec",
              phase: "end",
              result: `exit ${final.exitCode}`,
            });
          }
          break;
        }
        case "stopServices":
          ctx.emit({
            kind: "tool",
            turnId,
            name: "stopServices",
            phase: "end",
            result: String(ctx.stopServices?.() ?? 0),
          });
          break;
        case "appendFile": {
          const file = await open(step.path, "a");
          try {
            await file.write(`${step.line}\n`);
            await file.sync();
          } finally {
            await file.close();
          }
          break;
        }
        case "fail":
          throw new ScriptedTurnError(step.message, step.code ?? "scripted_failure");
      }
    }
    return { turnId, sessionId, text: texts.join(""), stopReason: "end" };
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    const onAbort = () => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
