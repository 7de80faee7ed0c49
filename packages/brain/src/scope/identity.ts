import type { DelegatedExecutionScope } from "./schema.js";

/**
 * The parent facts a delegated turn's identity is derived from, read fresh from the rows on every
 * rehydrate. Nothing here is stored: the proof is re-derived each time, so a parent that changes (moved to
 * a room, turned into a continuation) stops granting memory identity at once.
 */
export interface ParentSessionFacts {
  readonly sessionId: string;
  readonly accountId: string;
  /** `root`: a conversation of its own; `delegated`: a child of another session. */
  readonly kind: "root" | "delegated";
  /** A continuation session (resumed from another conversation's context). */
  readonly continuation: boolean;
  /** The storage channel id; shared rooms are `brain-ch-*`. */
  readonly channelId?: string | null;
}

export interface DelegatedTurnIdentity {
  /** Who the child acts for. */
  readonly principalAccountId: string;
  /** The memory identity the memory tools act for; absent for every ordinary child. */
  readonly memoryIdentity?: { readonly elowenUserId: string; readonly dreamRunId: string };
}

/**
 * IdentityResolver.forDelegatedTurn: a delegated child acts for its scope's account and gets no memory
 * identity, except a dream child whose parent proves it is the named account's own top-level
 * conversation: it belongs to that account, is not a continuation, is not itself a delegated child, and is
 * not a shared `brain-ch-*` room. The dream marker alone grants nothing.
 */
export function forDelegatedTurn(
  scope: DelegatedExecutionScope,
  parent: ParentSessionFacts,
): DelegatedTurnIdentity {
  const identity = { principalAccountId: scope.accountId };
  const dream = scope.dream;
  if (!dream) return identity;
  const ownTopLevel =
    parent.accountId === dream.accountUserId &&
    parent.accountId === scope.accountId &&
    parent.kind === "root" &&
    !parent.continuation &&
    !(parent.channelId ?? "").startsWith("brain-ch-");
  if (!ownTopLevel) return identity;
  return { ...identity, memoryIdentity: { elowenUserId: dream.accountUserId, dreamRunId: dream.runId } };
}
