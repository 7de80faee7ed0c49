import { ClientError } from "../client/connection.js";
import type { DaemonLink } from "./link.js";

/** A result as the MCP client sees it. */
export interface ResultView {
  readonly resultId: string;
  readonly kind: "subagent" | "workflow_summary";
  readonly childSessionId: string | null;
  readonly toolCallId: string;
  readonly outcome: "ok" | "error";
  readonly body: string;
  readonly spillPath: string | null;
  /** Given to this client before (only with `include_taken_since`). */
  readonly alreadyTaken: boolean;
  readonly takenAt?: string;
}

/**
 * How far before a lost take the next take looks back: the taking time is the database's clock, the
 * request's start is this process's.
 */
const CLOCK_MARGIN_MS = 5_000;

/**
 * The session's results as this MCP server hands them out. Taking is durable in the daemon (a result taken
 * is in the session's journal and acknowledged), so a result is given once across restarts of anything.
 * One gap is this process's own: a take the daemon committed whose reply never arrived (the daemon died
 * after the commit). The next take then also asks for what was taken since the lost one began, and gives
 * as new each of those this process never handed out.
 */
export class ResultInbox {
  readonly #given = new Set<string>();
  /** Taken for a call the client cancelled meanwhile: handed out first by the next take. */
  #owed: ResultView[] = [];
  #lostSince: number | undefined;

  constructor(private readonly link: DaemonLink) {}

  async take(options: {
    waitSeconds: number;
    includeTakenSince?: string;
    signal?: AbortSignal;
  }): Promise<ResultView[]> {
    const asked = options.includeTakenSince ? Date.parse(options.includeTakenSince) : undefined;
    const owed = this.#owed.splice(0);
    const fresh = await this.#takeFresh(owed.length > 0 ? 0 : options.waitSeconds, asked);
    const out = [...owed, ...fresh];
    if (options.signal?.aborted) {
      // The client gave up on this call: nothing it took is lost, the next call gives it.
      this.#owed = out.filter((r) => !r.alreadyTaken);
      return [];
    }
    return out;
  }

  async #takeFresh(waitSeconds: number, asked: number | undefined): Promise<ResultView[]> {
    const results = await this.#take({ waitSeconds }, asked);
    // A take lost before this call, or during it (asked again inside): what it took came back as taken.
    const lost = this.#lostSince;
    // Everything taken since the lost take began was in this answer: none of it is owed any more.
    if (lost !== undefined) this.#lostSince = undefined;
    const out: ResultView[] = [];
    for (const r of results) {
      const mine = !this.#given.has(r.resultId);
      if (r.alreadyTaken && mine && lost !== undefined) out.push({ ...r, alreadyTaken: false });
      else if (!r.alreadyTaken || (asked !== undefined && r.takenAt && Date.parse(r.takenAt) >= asked))
        out.push(r);
      this.#given.add(r.resultId);
    }
    return out;
  }

  /** Takes one result (a foreground call's); null when it was already given. */
  async takeOne(resultId: string): Promise<ResultView | null> {
    const results = await this.#take({ waitSeconds: 0, resultIds: [resultId] });
    const taken = results.find(
      (r) => r.resultId === resultId && (!r.alreadyTaken || !this.#given.has(r.resultId)),
    );
    if (!taken) return null;
    this.#given.add(taken.resultId);
    return { ...taken, alreadyTaken: false };
  }

  describe(results: readonly ResultView[]): string {
    if (results.length === 0) return "no new results";
    const again = results.filter((r) => r.alreadyTaken).length;
    const spilled = results.some((r) => r.spillPath)
      ? "; a long answer is cut: read its child with `read`"
      : "";
    return `${results.length - again} new result(s)${again ? `, ${again} already taken before` : ""}${spilled}`;
  }

  /**
   * One `session.take`, looking back to a lost take when there is one. A reply lost to a connection that
   * ended is asked again over a new connection: what the lost call took comes back marked as taken.
   */
  async #take(params: Record<string, unknown>, asked?: number): Promise<ResultView[]> {
    const { sessionId } = await this.link.session();
    for (let attempt = 1; ; attempt++) {
      const since = Math.min(asked ?? Number.POSITIVE_INFINITY, this.#lostSince ?? Number.POSITIVE_INFINITY);
      const started = Date.now();
      try {
        const r = await this.link.call<{ results: ResultView[] }>("session.take", {
          sessionId,
          ...params,
          ...(Number.isFinite(since) && { includeTakenSince: new Date(since).toISOString() }),
        });
        return r.results;
      } catch (e) {
        if (!(e instanceof ClientError) || e.code !== "connection_closed") throw e;
        this.#lostSince = Math.min(this.#lostSince ?? Number.POSITIVE_INFINITY, started - CLOCK_MARGIN_MS);
        if (attempt >= 3)
          throw new ClientError(
            "the connection to the daemon keeps ending; nothing is lost: call `results` again",
            "connection_closed",
          );
      }
    }
  }
}
