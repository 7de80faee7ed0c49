import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";

/**
 * The rules every parity baseline of this directory obeys. A stored baseline changes only by migration:
 * `CRW_PARITY_UPDATE=1 CRW_PARITY_REASON="<the source change and the exact delta it explains>"`. The
 * migration computes the delta between the stored and the current prefixes (which turns changed, and in
 * each the system prompt, which declared tools, the message context, or a pinned fingerprint) and refuses
 *  - without a reason, or with one that does not name every changed part (a tool by its name, "system
 *    prompt", "context", or the pinned fingerprint's name);
 *  - without a same-build fork proof from the same run: a fork's provider request, captured where the
 *    provider receives it, repeating its parent's system prompt, declared tools and message prefix byte
 *    for byte. A new capture alone never establishes parity.
 * The reason, the delta and the fork proof are stored with the baseline.
 */
export interface Prefix {
  readonly system: string;
  /** Declared tools by name: the JSON of each declaration. */
  readonly tools: Readonly<Record<string, string>>;
  readonly context: string;
}

export interface ForkProof {
  /** The parent request that asked for the fork and the fork's first request, as the provider got them. */
  readonly parentKey: string;
  readonly forkKey: string;
  readonly systemIdentical: boolean;
  readonly toolsIdentical: boolean;
  readonly messagePrefixIdentical: boolean;
  /** How many messages of the parent the fork's request repeats. */
  readonly prefixMessages: number;
  readonly digest: string;
}

export interface Baseline {
  readonly reason: string;
  readonly updatedAt: string;
  readonly delta: readonly string[];
  readonly forkProof: ForkProof;
  readonly pinned: Readonly<Record<string, string>>;
  readonly turns: Readonly<Record<string, string>>;
  readonly prefixes: Readonly<Record<string, Prefix>>;
}

export const digestOf = (value: unknown) => createHash("sha256").update(JSON.stringify(value)).digest("hex");

export class BaselineMigrationError extends Error {
  override readonly name = "BaselineMigrationError";
  constructor(
    readonly code: "reason_missing" | "reason_incomplete" | "fork_proof_missing" | "fork_not_identical",
    message: string,
  ) {
    super(message);
  }
}

/** Each changed part as `<part> @ <turn>`: `system prompt @ child:0`, `tool WorkflowStart @ root:1`, `pinned catalogPolicy`. */
export function prefixDelta(
  previous: Pick<Baseline, "prefixes" | "pinned"> | undefined,
  current: Pick<Baseline, "prefixes" | "pinned">,
): string[] {
  const delta: string[] = [];
  const before = previous?.prefixes ?? {};
  for (const key of [...new Set([...Object.keys(before), ...Object.keys(current.prefixes)])].sort()) {
    const a = before[key];
    const b = current.prefixes[key];
    if (!a || !b) {
      delta.push(`turn ${a ? "removed" : "added"} @ ${key}`);
      continue;
    }
    if (a.system !== b.system) delta.push(`system prompt @ ${key}`);
    for (const tool of [...new Set([...Object.keys(a.tools), ...Object.keys(b.tools)])].sort())
      if (a.tools[tool] !== b.tools[tool]) delta.push(`tool ${tool} @ ${key}`);
    if (a.context !== b.context) delta.push(`context @ ${key}`);
  }
  for (const name of [
    ...new Set([...Object.keys(previous?.pinned ?? {}), ...Object.keys(current.pinned)]),
  ].sort())
    if (previous?.pinned[name] !== current.pinned[name]) delta.push(`pinned ${name}`);
  return delta;
}

/** The word a reason must contain for one delta entry. */
function label(entry: string): string {
  if (entry.startsWith("pinned ")) return entry.slice("pinned ".length);
  const part = entry.slice(0, entry.indexOf(" @ "));
  if (part.startsWith("tool ")) return part.slice("tool ".length);
  if (part.startsWith("turn ")) return "turn";
  return part;
}

/** The migration rule: a reason naming the whole delta and a passing same-build fork proof, or a typed refusal. */
export function migrateBaseline(input: {
  previous: Baseline | undefined;
  current: Pick<Baseline, "prefixes" | "pinned" | "turns">;
  reason: string | undefined;
  forkProof: ForkProof | undefined;
}): Baseline {
  const reason = input.reason?.trim() ?? "";
  if (reason.length === 0)
    throw new BaselineMigrationError("reason_missing", "a baseline migration needs CRW_PARITY_REASON");
  if (!input.forkProof)
    throw new BaselineMigrationError(
      "fork_proof_missing",
      "a new capture alone does not establish parity: the run must prove a same-build fork's prefixes",
    );
  const p = input.forkProof;
  if (!p.systemIdentical || !p.toolsIdentical || !p.messagePrefixIdentical)
    throw new BaselineMigrationError(
      "fork_not_identical",
      `the fork's provider request differs from its parent's prefix (system ${p.systemIdentical}, tools ${p.toolsIdentical}, messages ${p.messagePrefixIdentical})`,
    );
  const delta = prefixDelta(input.previous, input.current);
  const unexplained = [...new Set(delta.map(label))].filter(
    (l) => !reason.toLowerCase().includes(l.toLowerCase()),
  );
  if (unexplained.length > 0)
    throw new BaselineMigrationError(
      "reason_incomplete",
      `the reason does not explain every changed part of the delta: ${unexplained.join(", ")} (delta: ${delta.join("; ")})`,
    );
  return { reason, updatedAt: new Date().toISOString(), delta, forkProof: p, ...input.current };
}

/** Compares the fork's first request with the parent's request that asked for it, as the provider got them. */
export function forkProof(
  parent: { key: string; system: unknown; tools: unknown; messages: readonly unknown[] },
  fork: { key: string; system: unknown; tools: unknown; messages: readonly unknown[] },
): ForkProof {
  const json = (v: unknown) => JSON.stringify(v);
  const prefixMessages = parent.messages.length;
  const proof = {
    parentKey: parent.key,
    forkKey: fork.key,
    systemIdentical: json(parent.system) === json(fork.system),
    toolsIdentical: json(parent.tools) === json(fork.tools),
    messagePrefixIdentical:
      fork.messages.length > prefixMessages &&
      json(fork.messages.slice(0, prefixMessages)) === json(parent.messages),
    prefixMessages,
  };
  return {
    ...proof,
    digest: digestOf({ parent, fork: { ...fork, messages: fork.messages.slice(0, prefixMessages) } }),
  };
}

/** Loads the stored baseline, migrates it when asked (CRW_PARITY_UPDATE=1), and returns what to compare against. */
export function checkedBaseline(
  path: string,
  current: Pick<Baseline, "prefixes" | "pinned" | "turns">,
  proof: ForkProof | undefined,
): Baseline {
  let stored: Baseline | undefined;
  try {
    stored = fromLegacy(JSON.parse(readFileSync(path, "utf8")));
  } catch {
    stored = undefined;
  }
  if (process.env.CRW_PARITY_UPDATE === "1") {
    const next = migrateBaseline({
      previous: stored,
      current,
      reason: process.env.CRW_PARITY_REASON,
      forkProof: proof,
    });
    writeFileSync(path, `${JSON.stringify(next, null, 2)}\n`);
    return next;
  }
  if (!stored)
    throw new Error(`no baseline at ${path}: create it with CRW_PARITY_UPDATE=1 and CRW_PARITY_REASON`);
  return stored;
}

interface LegacyPrefix {
  key: string;
  prefix: {
    model: unknown;
    systemPrompt: unknown;
    readOnly: unknown;
    tools: { name: string }[];
    context: unknown;
  };
}

/** The first format (a list of whole prefixes, no delta or fork proof) read as the current one. */
function fromLegacy(raw: Baseline | (Omit<Baseline, "prefixes"> & { prefixes: LegacyPrefix[] })): Baseline {
  if (!Array.isArray(raw.prefixes)) return raw as Baseline;
  const prefixes: Record<string, Prefix> = {};
  for (const { key, prefix } of raw.prefixes)
    prefixes[key] = {
      system: JSON.stringify({
        model: prefix.model,
        readOnly: prefix.readOnly,
        systemPrompt: prefix.systemPrompt,
      }),
      tools: Object.fromEntries(prefix.tools.map((t) => [t.name, JSON.stringify(t)])),
      context: JSON.stringify(prefix.context),
    };
  return { ...(raw as Omit<Baseline, "prefixes">), pinned: raw.pinned ?? {}, prefixes };
}
