import type { DelegationRepository } from "@crw/db";

/**
 * The seq a fork's copied context ends at: before the settled assistant message that asked for the fork
 * by `toolCallId`, or the whole settled journal when no message asked (a fork made through the API).
 */
export async function forkContextEnd(
  repo: DelegationRepository,
  sessionId: string,
  principalAccountId: string,
  toolCallId: string,
): Promise<number> {
  const point = await repo.forkPoint(sessionId, principalAccountId, toolCallId);
  return point.askingSeq === null ? point.lastSeq : point.askingSeq - 1;
}
