import { z } from "zod";

/**
 * Local execution requested from inside a runner and carried out by the daemon (its sandbox reaches the
 * paired computer). One request may stream partial events (`final: false`: process-started, stdout, stderr,
 * shell-cwd) before its one final result settles it. No polling credits, no automatic retries.
 */
const id = z.string().min(1).max(200);

export const localExecRequestSchema = z.discriminatedUnion("op", [
  z
    .object({
      op: z.literal("start"),
      command: z.array(z.string().min(1).max(65_536)).min(1).max(1024),
      /** A background service: once started it outlives the turn that started it. */
      service: z.boolean(),
    })
    .strict(),
  z.object({ op: z.literal("stdin"), processId: id, data: z.string().max(1_000_000) }).strict(),
]);
export type LocalExecRequest = z.infer<typeof localExecRequestSchema>;

export const localExecEventSchema = z.discriminatedUnion("kind", [
  z.object({ kind: z.literal("process-started"), processId: id }).strict(),
  z.object({ kind: z.literal("stdout"), data: z.string().max(1_000_000) }).strict(),
  z.object({ kind: z.literal("stderr"), data: z.string().max(1_000_000) }).strict(),
  z.object({ kind: z.literal("shell-cwd"), cwd: z.string().min(1).max(4096) }).strict(),
]);
export type LocalExecEvent = z.infer<typeof localExecEventSchema>;

export const localExecFinalSchema = z
  .object({ exitCode: z.number().int().nullable(), signal: z.string().max(32).nullable() })
  .strict();
export type LocalExecFinal = z.infer<typeof localExecFinalSchema>;
