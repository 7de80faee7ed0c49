import { createHash } from "node:crypto";
import { chmod, mkdir, open, rename } from "node:fs/promises";
import { join } from "node:path";
import type { DelegationRepository } from "@crw/db";
import { faultPoint } from "./faults.js";

/** Where results above the inline limit go, complete. A write resolves only once the bytes are synced. */
export interface SpillStore {
  write(
    sessionId: string,
    name: string,
    data: string,
  ): Promise<{ path: string; byteSize: number; sha256: string }>;
}

const SAFE = /^[A-Za-z0-9._-]{1,200}$/;

/**
 * Files under `root/<session>/`, written to a temporary name, fsynced, renamed, directory fsynced. A spilled
 * result is work (model output, tool output): its directories are 0700 and its files 0600, set explicitly
 * after creation so neither the umask nor a directory made earlier with a wider mode leaves it readable.
 */
export class FileSpillStore implements SpillStore {
  constructor(readonly root: string) {}

  async write(sessionId: string, name: string, data: string) {
    if (!SAFE.test(sessionId) || !SAFE.test(name)) throw new Error("spill names are plain file names");
    const dir = join(this.root, sessionId);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await chmod(this.root, 0o700);
    await chmod(dir, 0o700);
    const path = join(dir, name);
    const tmp = `${path}.tmp-${process.pid}`;
    const bytes = Buffer.from(data, "utf8");
    const fh = await open(tmp, "w", 0o600);
    try {
      // A leftover temporary file of the same name keeps its old mode through open(): narrow it.
      await fh.chmod(0o600);
      const half = Math.floor(bytes.length / 2);
      await fh.write(bytes.subarray(0, half));
      faultPoint("spill.during");
      await fh.write(bytes.subarray(half));
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, path);
    const d = await open(dir, "r");
    try {
      await d.sync();
    } finally {
      await d.close();
    }
    return { path, byteSize: bytes.length, sha256: createHash("sha256").update(bytes).digest("hex") };
  }
}

export const DEFAULT_TOOL_RESULT_INLINE_BYTES = 32 * 1024;
const PREVIEW_BYTES = 1024;

export interface PreparedCompletion {
  readonly outcome: "ok" | "error";
  readonly body: string;
  readonly byteSize: number;
  readonly spillId?: string;
  readonly error?: { readonly code: string; readonly message: string };
}

function preview(text: string): string {
  const bytes = Buffer.from(text, "utf8");
  if (bytes.length <= PREVIEW_BYTES) return text;
  return bytes
    .subarray(0, PREVIEW_BYTES)
    .toString("utf8")
    .replace(/\uFFFD+$/, "");
}

/**
 * createCompletionDelivery's preparation: a body up to `inlineBytes` (UTF-8) stays inline; above it, the
 * complete body goes to the spill store and the inbox gets the bounded placeholder (path, size, preview).
 * A failed write is an explicit error result with a DelegateRead hint, never a truncated success. Nothing
 * here acknowledges delivery: only the parent's journal commit does.
 */
export async function prepareCompletion(args: {
  repo: DelegationRepository;
  spill: SpillStore;
  inlineBytes: number;
  /** Whose inbox receives it, and the spill file's name there. */
  recipient: { readonly sessionId: string; readonly principalAccountId: string; readonly fileName: string };
  /** How the parent can still read the full output when the spill fails. */
  readHint: string;
  outcome: "ok" | "error";
  body: string;
}): Promise<PreparedCompletion> {
  const byteSize = Buffer.byteLength(args.body, "utf8");
  if (byteSize <= args.inlineBytes) return { outcome: args.outcome, body: args.body, byteSize };
  try {
    const written = await args.spill.write(args.recipient.sessionId, args.recipient.fileName, args.body);
    const record = await args.repo.recordSpill({
      sessionId: args.recipient.sessionId,
      principalAccountId: args.recipient.principalAccountId,
      path: written.path,
      byteSize: written.byteSize,
      sha256: written.sha256,
    });
    return {
      outcome: args.outcome,
      body: `[full result: ${written.byteSize} bytes at ${written.path}; read that path with Read]\n[preview]\n${preview(args.body)}`,
      byteSize: written.byteSize,
      spillId: record.id,
    };
  } catch (e) {
    const message = e instanceof Error ? e.message : String(e);
    return {
      outcome: "error",
      body: `The work finished, but its ${byteSize}-byte result could not be stored (${message}). ${args.readHint}`,
      byteSize,
      error: { code: "spill_failed", message },
    };
  }
}
