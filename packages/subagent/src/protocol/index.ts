import type { z } from "zod";
import { summarizeIssues } from "./check.js";
import { type InputFrame, inputFrameSchema } from "./input.js";
import { type OutputFrame, outputFrameSchema } from "./output.js";
import { checkTurnFrame } from "./turnFrames.js";

export { isBootFrameCandidate, parseBootFrame } from "./bootFrame.js";
export * from "./envelope.js";
export * from "./hostRpcMethods.js";
export * from "./input.js";
export * from "./localExec.js";
export * from "./output.js";
export * from "./policy.js";
export * from "./sessionTurn.js";
export * from "./turn.js";
export { checkTurnFrame, type TurnFrame } from "./turnFrames.js";

export type FrameParse<T> = { ok: true; frame: T } | { ok: false; issues: string };

function summarize(error: z.ZodError): string {
  return summarizeIssues(error.issues.map((i) => ({ path: i.path.map(String), message: i.message })));
}

/** Validate a frame received by the runner. Invalid frames are refused by the caller, never acted on. */
export function parseInputFrame(raw: unknown): FrameParse<InputFrame> {
  const r = inputFrameSchema.safeParse(raw);
  return r.success ? { ok: true, frame: r.data } : { ok: false, issues: summarize(r.error) };
}

/** Validate a frame received by the daemon from a runner; a session turn's frames are checked by hand first. */
export function parseOutputFrame(raw: unknown): FrameParse<OutputFrame> {
  const checked = checkTurnFrame(raw);
  if (checked) return { ok: true, frame: checked };
  const r = outputFrameSchema.safeParse(raw);
  return r.success ? { ok: true, frame: r.data } : { ok: false, issues: summarize(r.error) };
}
