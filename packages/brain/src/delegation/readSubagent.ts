import type { DelegationRepository, TranscriptMessage } from "@crw/db";
import { assistantText } from "./context.js";

export const ASSISTANT_PAGE = 32;

/**
 * The canonical reader of a session's answer: assistant bodies newest-first, in pages of 32, until one has
 * non-empty text or the rows run out. The answer keeps its original whitespace (no trimming wrapper), so
 * any number of empty failed continuations after it cannot hide it.
 */
export async function lastSettledAssistantText(
  repo: DelegationRepository,
  sessionId: string,
  principalAccountId: string,
): Promise<string | undefined> {
  let before: number | undefined;
  for (;;) {
    const page = await repo.recentAssistantMessages(sessionId, principalAccountId, ASSISTANT_PAGE, before);
    for (const row of page) {
      const text = assistantText(row.message);
      if (text.trim().length > 0) return text;
    }
    if (page.length < ASSISTANT_PAGE) return undefined;
    before = page[page.length - 1]?.seq;
  }
}

/**
 * The ordinary last-row reply reader: one assistant row, the newest. A call's result is the answer of
 * that call's last turn; an empty last answer is no answer (it never falls back to an older call's reply,
 * which only DelegateRead's canonical reader may surface).
 */
export async function latestAssistantText(
  repo: DelegationRepository,
  sessionId: string,
  principalAccountId: string,
): Promise<string | undefined> {
  const [row] = await repo.recentAssistantMessages(sessionId, principalAccountId, 1);
  return replyOf(row?.message);
}

/** A call's reply from its newest assistant message: an empty one is no answer. */
export function replyOf(message: TranscriptMessage | undefined): string | undefined {
  const text = message ? assistantText(message) : "";
  return text.trim().length > 0 ? text : undefined;
}

/** DelegateRead: the ownership guard first (the child must be this parent's, under this principal), then the read. */
export async function readSubagent(
  repo: DelegationRepository,
  parentSessionId: string,
  childSessionId: string,
  principalAccountId: string,
): Promise<string | undefined> {
  await repo.getChildSession(parentSessionId, childSessionId, principalAccountId);
  return lastSettledAssistantText(repo, childSessionId, principalAccountId);
}
