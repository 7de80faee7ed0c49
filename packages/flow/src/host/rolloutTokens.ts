import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import { z } from "zod";
import type { TokenCount } from "./sessionHost.js";

/**
 * The thread's cumulative token count: the `info.total_token_usage` of the rollout's last
 * `event_msg`/`token_count` line (Codex writes one after each model response; `info` is null before the
 * first). The file is read backwards in chunks, so a long rollout costs only its tail. A line that does not parse
 * (a torn last line while the host writes it) is skipped; undefined means the rollout has no count yet.
 * The reads are synchronous: the tail was just written by the host (it is in the page cache), and a chunk
 * read through a FileHandle is four thread-pool round trips that cost more than the read.
 */

const usageWire = z.looseObject({
  input_tokens: z.number().int().nonnegative(),
  cached_input_tokens: z.number().int().nonnegative().optional(),
  output_tokens: z.number().int().nonnegative(),
  reasoning_output_tokens: z.number().int().nonnegative().optional(),
  total_tokens: z.number().int().nonnegative(),
});

const tokenCountLineWire = z.looseObject({
  type: z.literal("event_msg"),
  payload: z.looseObject({
    type: z.literal("token_count"),
    info: z.looseObject({ total_token_usage: usageWire }).nullable().optional(),
  }),
});

export class RolloutUnreadableError extends Error {
  override readonly name = "RolloutUnreadableError";
  readonly retryable = false;
  constructor(
    readonly path: string,
    message: string,
  ) {
    super(message);
  }
}

const defaultChunkSize = 64 * 1024;

export async function readRolloutTokenCount(
  path: string,
  options: { chunkSize?: number } = {},
): Promise<TokenCount | undefined> {
  const chunkSize = Math.max(1, options.chunkSize ?? defaultChunkSize);
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch (e) {
    throw new RolloutUnreadableError(path, `rollout ${path} cannot be read: ${(e as Error).message}`);
  }
  try {
    return tailTokenCount(fd, fstatSync(fd).size, chunkSize);
  } catch (e) {
    throw new RolloutUnreadableError(path, `rollout ${path} cannot be read: ${(e as Error).message}`);
  } finally {
    closeSync(fd);
  }
}

/** The newest token count in the file's first `size` bytes, read backwards `chunkSize` at a time. */
function tailTokenCount(fd: number, size: number, chunkSize: number): TokenCount | undefined {
  let end = size;
  // The bytes after `end` up to the first newline: the end of a line that starts in an earlier chunk.
  let partial = Buffer.alloc(0);
  while (end > 0) {
    const start = Math.max(0, end - chunkSize);
    const chunk = Buffer.alloc(end - start);
    readSync(fd, chunk, 0, chunk.length, start);
    let buffer = Buffer.concat([chunk, partial]);
    if (start > 0) {
      const newline = buffer.indexOf(0x0a);
      if (newline < 0) {
        partial = buffer;
        end = start;
        continue;
      }
      partial = buffer.subarray(0, newline);
      buffer = buffer.subarray(newline + 1);
    }
    const lines = buffer.toString("utf8").split("\n");
    for (let i = lines.length - 1; i >= 0; i--) {
      const count = tokenCountOf(lines[i] ?? "");
      if (count) return count;
    }
    end = start;
  }
  return undefined;
}

function tokenCountOf(line: string): TokenCount | undefined {
  if (!line.includes('"token_count"')) return undefined;
  let raw: unknown;
  try {
    raw = JSON.parse(line);
  } catch {
    return undefined;
  }
  const parsed = tokenCountLineWire.safeParse(raw);
  const usage = parsed.success ? parsed.data.payload.info?.total_token_usage : undefined;
  if (!usage) return undefined;
  return {
    input: usage.input_tokens,
    cached_input: usage.cached_input_tokens ?? 0,
    output: usage.output_tokens,
    reasoning_output: usage.reasoning_output_tokens ?? 0,
    total: usage.total_tokens,
  };
}
