import { bearsUsage, type DelegationRepository, type ProviderUsage } from "@crw/db";
import { ASSISTANT_PAGE } from "./readSubagent.js";

/** One provider response that reported usage, with the figures that tell how much of its prompt was cached. */
export interface UsageBearingResponse {
  readonly sessionId: string;
  /** The assistant row that recorded the response. */
  readonly seq: number;
  readonly usage: ProviderUsage;
  /** The prompt the provider processed for it: uncached input + read from cache + written to cache. */
  readonly promptTokens: number;
  /** The share of that prompt read from the cache (0 when the prompt is empty). */
  readonly cacheReadRatio: number;
}

export interface UsagePaging {
  readonly response: UsageBearingResponse | null;
  /** Assistant rows read to find it (every row of every page read). */
  readonly rowsRead: number;
  readonly pages: number;
}

function responseOf(sessionId: string, seq: number, usage: ProviderUsage): UsageBearingResponse {
  const promptTokens = usage.input + usage.cacheRead + usage.cacheWrite;
  return {
    sessionId,
    seq,
    usage,
    promptTokens,
    cacheReadRatio: promptTokens === 0 ? 0 : usage.cacheRead / promptTokens,
  };
}

/**
 * A session's newest usage-bearing response: its assistant rows newest-first, in pages of 32 (the canonical
 * reader's paging), until a row recorded with usage that carries figures appears or the rows run out.
 * `beforeSeq` starts below a row (e.g. a fork point + 1).
 */
export async function newestUsageBearingResponse(
  repo: DelegationRepository,
  sessionId: string,
  principalAccountId: string,
  options: { readonly beforeSeq?: number } = {},
): Promise<UsagePaging> {
  let before = options.beforeSeq;
  let rowsRead = 0;
  let pages = 0;
  for (;;) {
    const page = await repo.recentAssistantMessages(sessionId, principalAccountId, ASSISTANT_PAGE, before);
    pages++;
    for (const row of page) {
      rowsRead++;
      if (bearsUsage(row.usage))
        return { response: responseOf(sessionId, row.seq, row.usage), rowsRead, pages };
    }
    if (page.length < ASSISTANT_PAGE) return { response: null, rowsRead, pages };
    before = page[page.length - 1]?.seq;
  }
}

export interface ForkPrefixDiagnostics {
  readonly sessionId: string;
  readonly parentSessionId: string | null;
  /** Whether the session is a fork: it inherited its parent's rows 1..inheritedThrough. */
  readonly fork: boolean;
  readonly inheritedThrough: number | null;
  /**
   * The session's newest usage-bearing response. Rows a fork copied carry no usage, so for a fork this is
   * always its own response (its first one, until it answers again).
   */
  readonly response: UsageBearingResponse | null;
  /**
   * For a fork: the parent's newest usage-bearing response whose request's prompt lay within the inherited
   * prefix (seq <= inheritedThrough + 1: a response's request is everything before its row). For a fork made
   * by a Delegate call that is the response asking for the fork, whose request is exactly the fork's
   * inherited context.
   */
  readonly parentResponse: UsageBearingResponse | null;
  /** What the parent's request left in the provider's cache: its cacheRead + cacheWrite. */
  readonly parentCachedTokens: number | null;
  /**
   * For a fork: whether its response read at least the parent's cached prefix from the cache
   * (`response.usage.cacheRead >= parentCachedTokens`). Null when it cannot be judged: not a fork, a
   * response missing on either side, or a parent request that cached nothing.
   */
  readonly prefixFromCache: boolean | null;
  /** Assistant rows read in all (the session's, then the parent's). */
  readonly rowsRead: number;
}

/**
 * Fork-prefix diagnostics: pages the session's assistant rows until a usage-bearing response appears and
 * reports its cache figures; for a fork, the same for the parent's request at the fork point, and whether the fork's
 * response read the parent's cached prefix. Reads only, under the session's principal.
 */
export async function forkPrefixDiagnostics(
  repo: DelegationRepository,
  sessionId: string,
  principalAccountId: string,
): Promise<ForkPrefixDiagnostics> {
  const session = await repo.getSession(sessionId, principalAccountId);
  const own = await newestUsageBearingResponse(repo, session.id, principalAccountId);
  const inheritedThrough = session.inheritedThrough ?? null;
  const fork = inheritedThrough !== null && inheritedThrough > 0 && session.parentSessionId !== null;
  let parent: UsagePaging | null = null;
  if (fork && session.parentSessionId) {
    parent = await newestUsageBearingResponse(repo, session.parentSessionId, principalAccountId, {
      beforeSeq: inheritedThrough + 2,
    });
  }
  const parentResponse = parent?.response ?? null;
  const parentCachedTokens = parentResponse
    ? parentResponse.usage.cacheRead + parentResponse.usage.cacheWrite
    : null;
  const prefixFromCache =
    fork && own.response && parentCachedTokens !== null && parentCachedTokens > 0
      ? own.response.usage.cacheRead >= parentCachedTokens
      : null;
  return {
    sessionId: session.id,
    parentSessionId: session.parentSessionId,
    fork,
    inheritedThrough,
    response: own.response,
    parentResponse,
    parentCachedTokens,
    prefixFromCache,
    rowsRead: own.rowsRead + (parent?.rowsRead ?? 0),
  };
}
