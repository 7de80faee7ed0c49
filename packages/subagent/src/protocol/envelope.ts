import { z } from "zod";

/**
 * Every reply across the runner boundary is `{ ok: value }` or `{ error: { name, message, code } }`.
 * Errors travel as data: receivers match on `name`/`code`, never on `instanceof` or message text.
 */
export const remoteErrorSchema = z
  .object({
    name: z.string().min(1).max(128),
    message: z.string().max(16_384),
    code: z.string().min(1).max(128),
  })
  .strict();
export type RemoteError = z.infer<typeof remoteErrorSchema>;

export function envelope<T extends z.ZodType>(ok: T) {
  return z.union([z.object({ ok }).strict(), z.object({ error: remoteErrorSchema }).strict()]);
}
export type Envelope<T> = { ok: T } | { error: RemoteError };

/** Request ids are opaque strings minted by the side that asks. */
export const requestIdSchema = z.string().min(1).max(128);

export function errorToRemote(e: Error): RemoteError {
  const code = (e as { code?: unknown }).code;
  return {
    name: e.name.slice(0, 128) || "Error",
    message: e.message.slice(0, 16_384),
    code: typeof code === "string" && code.length > 0 ? code.slice(0, 128) : "internal",
  };
}
