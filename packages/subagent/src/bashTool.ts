import { z } from "zod";
import type { ChildTurnContext } from "./childTurn.js";
import type { LocalExecEvent } from "./protocol/localExec.js";

/**
 * The Bash tool of a local child, as a runner runs it: every command goes to the paired computer through the
 * daemon's local execution (ctx.localExec), never to the runner's own machine.
 *
 * - Foreground: waits for the exit and answers with the exit code and the output.
 * - `run_in_background: true`: answers once the process started. Its lifetime is the turn's: the turn's
 *   end cancels it (an unadmitted start stays turn-bound).
 * - `run_in_background: true, backgroundMode: "service"`: a service. Once the daemon reports
 *   process-started it is admitted into the runner's process registry (LocalExecClient) and outlives the
 *   turn; only the registry cancels it (stopServices, naming the original call and turn), its own exit ends
 *   it, and a lost transport reports session.closed. It does not hold the turn, its settlement or a slot.
 */
export const bashArgsSchema = z
  .object({
    command: z.string().min(1).max(65_536),
    run_in_background: z.boolean().default(false),
    backgroundMode: z.literal("service").optional(),
  })
  .strict();
export type BashArgs = z.input<typeof bashArgsSchema>;

/** Output a foreground answer keeps (the rest is dropped, the size is reported). */
const OUTPUT_LIMIT = 64 * 1024;

export class BashToolError extends Error {
  override readonly name = "BashToolError";
  readonly retryable = false;
  constructor(
    message: string,
    readonly code: "invalid_args" | "no_local_execution",
  ) {
    super(message);
  }
}

export async function runBashTool(ctx: ChildTurnContext, raw: unknown): Promise<string> {
  const parsed = bashArgsSchema.safeParse(raw ?? {});
  if (!parsed.success) throw new BashToolError(`Bash: ${parsed.error.message}`, "invalid_args");
  const args = parsed.data;
  if (args.backgroundMode === "service" && !args.run_in_background) {
    throw new BashToolError('Bash: backgroundMode "service" needs run_in_background: true', "invalid_args");
  }
  if (!ctx.localExec) {
    throw new BashToolError("Bash: no local execution target for this turn", "no_local_execution");
  }
  const service = args.backgroundMode === "service";
  let output = "";
  let dropped = 0;
  const collect = (event: LocalExecEvent) => {
    // A background process's output is its own; only a foreground command's is the tool's answer.
    if (args.run_in_background || (event.kind !== "stdout" && event.kind !== "stderr")) return;
    const room = OUTPUT_LIMIT - output.length;
    output += event.data.slice(0, Math.max(0, room));
    dropped += Math.max(0, event.data.length - Math.max(0, room));
  };
  const call = ctx.localExec({ op: "start", command: ["sh", "-c", args.command], service }, collect);
  if (args.run_in_background) {
    const processId = await call.started;
    // The final result of a background process is the registry's (or the turn's) business, not the tool's.
    call.final.catch(() => {});
    return service ? `service ${processId} started` : `background ${processId} started`;
  }
  const final = await call.final;
  const status = final.signal ? `signal ${final.signal}` : `exit ${final.exitCode}`;
  return `${status}\n${output}${dropped > 0 ? `\n[${dropped} more characters]` : ""}`;
}
