import { type HelperRole, helperPairsFrom } from "./line.js";
import { type BindOutcome, bindOrchestrator, closeOrchestrator, readBinding } from "./store.js";

/**
 * What the engine calls, in the seed's words: the start binds the owner before any process of the run
 * exists; the run's process binds again right after its started row (with the pairs that row pinned)
 * and closes the line when the run ends; `crw flow next` only reads it and warns.
 */
export interface RunOwner {
  state: string;
  owner: string;
  runId: string;
}

/** Binds the owner to the run with a role table's pairs (model/effort, null when undecided). */
export function bindRunOwner(
  options: RunOwner & {
    policyDigest: string;
    rolePairs: Partial<Record<HelperRole, { model: string | null; effort: string | null }>>;
    isLive?: (runId: string) => boolean;
  },
): BindOutcome & { warning: string | null } {
  let outcome: BindOutcome;
  try {
    outcome = bindOrchestrator({
      state: options.state,
      owner: options.owner,
      runId: options.runId,
      policyDigest: options.policyDigest,
      helperPairs: helperPairsFrom(options.rolePairs),
      ...(options.isLive ? { isLive: options.isLive } : {}),
    });
  } catch (e) {
    // helperPairsFrom refuses an effort without a model: no line is written for such a table
    outcome = { bound: false, reason: "unwritable", message: (e as Error).message };
  }
  return { ...outcome, warning: outcome.bound ? null : outcome.message };
}

export function closeRunOwner(options: RunOwner & { reason?: string }) {
  return closeOrchestrator(options);
}

export type OwnerLineWarningKind =
  | "owner_line_missing"
  | "owner_line_other_run"
  | "owner_line_other_digest"
  | "owner_binding_unreadable";

/**
 * For `crw flow next`: a warning when the owner's last line is not the holder's (none, another run's,
 * another digest's), or cannot be read; null when it is. Writes nothing.
 */
export function ownerLineWarning(
  options: RunOwner & { policyDigest: string },
): { warning: OwnerLineWarningKind; message: string } | null {
  const read = readBinding(options.state, options.owner);
  if (read.warning) return { warning: "owner_binding_unreadable", message: read.warning };
  const line = read.line;
  const tail =
    "the hook gives the owner's spawns no pair of the run until the run's process (or its next process, on a resume) binds it";
  if (!line)
    return { warning: "owner_line_missing", message: `owner ${options.owner} has no open line: ${tail}` };
  if (line.run_id !== options.runId)
    return {
      warning: "owner_line_other_run",
      message: `owner ${options.owner}'s last line is run ${line.run_id}'s, not ${options.runId}'s: ${tail}`,
    };
  if (line.policyDigest !== options.policyDigest)
    return {
      warning: "owner_line_other_digest",
      message: `owner ${options.owner}'s line has policy digest ${line.policyDigest}, the holder pinned ${options.policyDigest}`,
    };
  return null;
}
