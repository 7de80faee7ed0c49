import { open } from "node:fs/promises";
import type { DelegationRepository, SessionRow } from "@crw/db";
import { z } from "zod";
import { DelegationError } from "./errors.js";
import type { MutatingTool } from "./scopedTools.js";
import { parseToolArgs } from "./tools.js";

/** The most bytes one Read returns; a longer output is read page by page with `offset`. */
export const SPILL_READ_PAGE = 64 * 1024;

const readArgs = z
  .object({
    path: z.string().min(1).max(4096),
    offset: z.number().int().nonnegative().optional(),
    limit: z.number().int().positive().max(SPILL_READ_PAGE).optional(),
  })
  .strict();
const READ_PARAMETERS = z.toJSONSchema(readArgs, { io: "input" }) as Record<string, unknown>;

/** Moves a byte index back to the start of a UTF-8 character (never splits one). */
function charStart(bytes: Buffer, index: number): number {
  let i = index;
  while (i > 0 && i < bytes.length && ((bytes[i] ?? 0) & 0xc0) === 0x80) i--;
  return i;
}

/**
 * One page of a stored text of `size` bytes: `window` holds its bytes from `offset` (`limit` and a few more
 * when there are more). The page ends on a character boundary (a tiny limit inside one character still
 * makes progress) and says where to read on.
 */
export function textPage(window: Buffer, offset: number, size: number, limit: number, path: string): string {
  if (offset >= size) return `[end of ${path}: ${size} bytes]`;
  const available = size - offset;
  let end = Math.min(limit, available);
  if (end < available) end = charStart(window, end) || end;
  const text = window.subarray(0, end).toString("utf8");
  const next = offset + end;
  return next < size ? `${text}\n[bytes ${offset}-${next} of ${size}; read on with offset ${next}]` : text;
}

/**
 * `Read` for spilled results, in the session's own namespace: only a path the spill store recorded for this
 * session (a result delivered to it, spilled above the inline limit) can be read, page by page. A session
 * without file tools (a root conversation) reads its spilled results with it; nothing else on the host is
 * reachable through it, and it never writes.
 */
export function spillReadTool(repo: DelegationRepository, session: SessionRow): MutatingTool {
  return {
    name: "Read",
    description:
      "Read a spilled result delivered to you (the path in its placeholder), up to 64 KiB per call; " +
      "continue with offset for the rest.",
    parameters: READ_PARAMETERS,
    mutates: false,
    subject: (args) => (typeof args.path === "string" ? args.path : undefined),
    async execute(raw) {
      const { path, offset = 0, limit = SPILL_READ_PAGE } = parseToolArgs(readArgs, raw, "Read");
      const record = await repo.spilledOutput(session.id, session.principalAccountId, path);
      if (!record) {
        throw new DelegationError(
          "not_found",
          "Read reaches only spilled results delivered to this session",
          {
            path,
          },
        );
      }
      const fh = await open(record.path, "r");
      try {
        const size = (await fh.stat()).size;
        if (size !== record.byteSize) {
          throw new DelegationError("not_found", "the spilled result changed since it was stored", {
            path,
            expected: record.byteSize,
            actual: size,
          });
        }
        const buffer = Buffer.alloc(Math.max(0, Math.min(size - offset, limit + 4)));
        await fh.read(buffer, 0, buffer.length, offset);
        return { content: textPage(buffer, offset, size, limit, path) };
      } finally {
        await fh.close();
      }
    },
  };
}
