import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { CallFold, CallPosition } from "../src/engine/callFold.js";
import { clockRanOut, harvest, loseAttempt } from "../src/engine/harvestTurn.js";
import type { FlowEvent, RunContext } from "../src/engine/runContext.js";
import type { HostResult, HostThread, HostTurn, HostTurnStatus } from "../src/host/sessionHost.js";
import type { NewRow } from "../src/journal/rows.js";

/**
 * The judgement of a lost attempt (harvestTurn.ts): a bound subagent whose thread the host lost, or whose
 * turn ended without an answer or an error, is lost after LostAfter with no change of what the host shows
 * (at once when both), and only if one more read right before the loss still shows it so. Each case drives
 * harvest() round by round against scripted host answers, on a clock moved by hand.
 */

const CALL = "explore.1";
const THREAD = "thr-sub";
const TURN = "turn-2";
const LOST_AFTER = 1_000;

// the bound attempt as the call's rows show it: the second turn of its subagent's conversation
const pos = {
  kind: "harvest",
  step: { marker: `${CALL}/t2-a1`, k: 2, attempt: 1, op: `${CALL}/t2` },
  thread: { thread_id: THREAD },
  turn: { turn_id: TURN },
} as Extract<CallPosition, { kind: "harvest" }>;
const noIntent = { interrupt: null } as CallFold;

const turn = (status: HostTurnStatus, items = 1, error: HostTurn["error"] = null, id = TURN): HostTurn => ({
  id,
  status,
  error,
  items: Array.from({ length: items }, (_, i) => ({
    type: "other" as const,
    id: `${id}-i${i}`,
    kind: "reasoning",
  })),
});

/**
 * A read of the subagent's thread: its earlier turn (completed, answered) first, then the bound one when
 * `bound` is given, so the bound turn is found by its id, not by its place.
 */
const shows = (
  status: "idle" | "notLoaded" | "systemError",
  bound: HostTurn | null,
): HostResult<HostThread> => ({
  ok: true,
  value: {
    id: THREAD,
    parentThreadId: "owner",
    agentRole: "explorer",
    agentNickname: null,
    model: null,
    reasoningEffort: null,
    cwd: null,
    status: { type: status },
    rolloutPath: null,
    turns: [turn("completed", 2, null, "turn-1"), ...(bound ? [bound] : [])],
  },
});
const unreachable: HostResult<HostThread> = {
  ok: false,
  reason: "unreachable",
  message: "connect ECONNREFUSED",
};
const unknownThread: HostResult<HostThread> = {
  ok: false,
  reason: "unknown_thread",
  message: "no such thread",
};

/** What one harvest round did: lost the attempt, waited for the host, or returned to be asked again. */
type Outcome = "lost" | "waits" | "returns";

/** A run context with only what the loss rules touch: the host's reads scripted per round. */
class LossRun {
  readonly rows: NewRow[] = [];
  readonly events: FlowEvent[] = [];
  readonly clocks = new Map<string, { sig: string; since: number }>();
  private answers: HostResult<HostThread>[] = [];
  private naps = 0;
  readonly rc = {
    pollMs: 0,
    lostAfterMs: LOST_AFTER,
    host: {
      readThread: async (id: string) => {
        expect(id).toBe(THREAD);
        const a = this.answers.shift();
        if (!a) throw new Error("the thread was read more often than the round expects");
        return a;
      },
    },
    hostVersion: () => 0,
    hostNap: async () => {
      this.naps++;
    },
    append: (rows: NewRow[]) => {
      this.rows.push(...rows);
      return [];
    },
    emit: (e: FlowEvent) => this.events.push(e),
  } as unknown as RunContext;

  /** One harvest at `at` ms whose thread reads answer `reads` in order (each must be read). */
  async round(at: number, ...reads: HostResult<HostThread>[]): Promise<Outcome> {
    vi.setSystemTime(at);
    this.answers = reads;
    const rows = this.rows.length;
    const naps = this.naps;
    await harvest(this.rc, CALL, noIntent, pos, this.clocks);
    expect(this.answers, "reads the round expected and harvest did not make").toEqual([]);
    if (this.rows.length > rows) return "lost";
    return this.naps > naps ? "waits" : "returns";
  }

  lost(): NewRow[] {
    return this.rows.filter((r) => r.type === "session_attempt_lost");
  }
}

let run: LossRun;
beforeEach(() => {
  vi.useFakeTimers({ toFake: ["Date"] });
  run = new LossRun();
});
afterEach(() => {
  vi.useRealTimers();
});

describe("the lost clock", () => {
  it("a turn running on a loaded thread runs no lost clock: each round reads once and waits for the host", async () => {
    const running = shows("idle", turn("inProgress"));
    expect(await run.round(0, running)).toBe("waits");
    expect(await run.round(2 * LOST_AFTER, running)).toBe("waits");
    expect(await run.round(5 * LOST_AFTER, running)).toBe("waits");
    expect(run.rows).toEqual([]);
  });

  it("an unloaded thread whose turn shows no change loses its attempt LostAfter after it was first seen so", async () => {
    const stuck = shows("notLoaded", turn("inProgress"));
    expect(await run.round(0, stuck)).toBe("waits");
    expect(await run.round(LOST_AFTER - 1, stuck)).toBe("waits");
    expect(await run.round(LOST_AFTER, stuck, stuck)).toBe("lost");
    expect(run.lost()).toEqual([
      expect.objectContaining({
        reason: `no change for ${LOST_AFTER} ms`,
        host_status: "notLoaded",
        turn_status: "inProgress",
      }),
    ]);
  });

  // each part of what the host shows restarts the clock: a round past LostAfter since the first sighting
  // still waits, and the loss comes LostAfter after the change
  const changes = [
    {
      change: "the thread's status changes",
      before: shows("notLoaded", turn("inProgress")),
      after: shows("systemError", turn("inProgress")),
      lostAs: { host_status: "systemError", turn_status: "inProgress" },
    },
    {
      // a loaded thread whose turn ended without an error is judged by the same clock
      change: "the turn's status changes",
      before: shows("idle", turn("interrupted")),
      after: shows("idle", turn("failed")),
      lostAs: { host_status: "idle", turn_status: "failed" },
    },
    {
      change: "the turn shows more items",
      before: shows("notLoaded", turn("inProgress", 1)),
      after: shows("notLoaded", turn("inProgress", 2)),
      lostAs: { host_status: "notLoaded", turn_status: "inProgress" },
    },
  ];
  for (const { change, before, after, lostAs } of changes) {
    it(`the clock restarts when ${change}`, async () => {
      expect(await run.round(0, before)).toBe("waits");
      expect(await run.round(600, after)).toBe("waits");
      expect(await run.round(1_200, after)).toBe("waits");
      expect(await run.round(1_600, after, after)).toBe("lost");
      expect(run.lost()).toEqual([expect.objectContaining(lostAs)]);
    });
  }

  it("the clock is dropped while the thread is fine: a thread that goes bad again waits a whole LostAfter again", async () => {
    const bad = shows("notLoaded", turn("inProgress"));
    expect(await run.round(0, bad)).toBe("waits");
    expect(await run.round(600, shows("idle", turn("inProgress")))).toBe("waits");
    expect(await run.round(1_200, bad)).toBe("waits");
    expect(await run.round(2_100, bad)).toBe("waits");
    expect(await run.round(2_200, bad, bad)).toBe("lost");
  });

  it("clockRanOut: a new sig starts the clock, which has run out at exactly LostAfter, not a millisecond before", () => {
    const clocks = new Map<string, { sig: string; since: number }>();
    const rc = { lostAfterMs: LOST_AFTER } as RunContext;
    vi.setSystemTime(10_000);
    expect(clockRanOut(rc, clocks, "m", "notLoaded:inProgress:1")).toBe(false);
    vi.setSystemTime(10_000 + LOST_AFTER - 1);
    expect(clockRanOut(rc, clocks, "m", "notLoaded:inProgress:1")).toBe(false);
    vi.setSystemTime(10_000 + LOST_AFTER);
    expect(clockRanOut(rc, clocks, "m", "notLoaded:inProgress:1")).toBe(true);
    expect(clockRanOut(rc, clocks, "m", "notLoaded:inProgress:2")).toBe(false);
    expect(clocks.get("m")).toEqual({ sig: "notLoaded:inProgress:2", since: 10_000 + LOST_AFTER });
  });
});

describe("the read right before a loss", () => {
  // an unloaded thread whose turn ended without an error is judged at its first round, no clock
  const ended = shows("notLoaded", turn("failed"));

  it("an unloaded thread whose turn ended without an error loses its attempt at once", async () => {
    expect(await run.round(0, ended, ended)).toBe("lost");
    expect(run.lost()).toEqual([
      expect.objectContaining({
        reason: "turn failed without an error",
        host_status: "notLoaded",
        turn_status: "failed",
      }),
    ]);
  });

  it("a host unreachable at the re-read judges nothing: no loss, and the next round asks again", async () => {
    expect(await run.round(0, ended, unreachable)).toBe("returns");
    expect(run.rows).toEqual([]);
    expect(await run.round(50, ended, ended)).toBe("lost");
  });

  it("a re-read that finds the turn completed loses nothing: its answer is harvested next round", async () => {
    expect(await run.round(0, ended, shows("idle", turn("completed", 3)))).toBe("returns");
    expect(run.rows).toEqual([]);
  });

  it("a re-read that finds the turn ended with an error loses nothing: the failure is read next round", async () => {
    const error = { message: "stream disconnected", codexErrorInfo: "responseStreamDisconnected" };
    expect(await run.round(0, ended, shows("idle", turn("failed", 1, error)))).toBe("returns");
    expect(run.rows).toEqual([]);
  });

  it("a re-read that finds the thread loaded again with its turn running waits for it", async () => {
    const stuck = shows("notLoaded", turn("inProgress"));
    expect(await run.round(0, stuck)).toBe("waits");
    expect(await run.round(LOST_AFTER, stuck, shows("idle", turn("inProgress")))).toBe("returns");
    expect(run.rows).toEqual([]);
  });

  it("a re-read that finds the thread loaded again but without the bound turn loses the attempt, its turn status null", async () => {
    const stuck = shows("notLoaded", turn("inProgress"));
    expect(await run.round(0, stuck)).toBe("waits");
    expect(await run.round(LOST_AFTER, stuck, shows("idle", null))).toBe("lost");
    expect(run.lost()).toEqual([
      expect.objectContaining({
        reason: `no change for ${LOST_AFTER} ms`,
        host_status: "idle",
        turn_status: null,
      }),
    ]);
  });

  it("a thread the host no longer knows loses its attempt after LostAfter, its host status unknown", async () => {
    expect(await run.round(0, unknownThread)).toBe("waits");
    expect(await run.round(LOST_AFTER, unknownThread, unknownThread)).toBe("lost");
    expect(run.lost()).toEqual([expect.objectContaining({ host_status: "unknown", turn_status: null })]);
  });

  it("a turn that ended without an error on a loaded thread loses its attempt after LostAfter, with the reason 'turn <status> without an error'", async () => {
    const idle = shows("idle", turn("interrupted"));
    expect(await run.round(0, idle)).toBe("waits");
    expect(await run.round(LOST_AFTER, idle, idle)).toBe("lost");
    expect(run.rows).toEqual([
      {
        type: "session_attempt_lost",
        call: CALL,
        op: `${CALL}/t2`,
        attempt: 1,
        agent_id: THREAD,
        k: 2,
        turn_id: TURN,
        reason: "turn interrupted without an error",
        host_status: "idle",
        turn_status: "interrupted",
      },
    ]);
  });
});

describe("loseAttempt", () => {
  it("the attempt_lost event carries the call, the attempt and the reason", async () => {
    const step = { ...pos.step, attempt: 3 };
    await loseAttempt(run.rc, CALL, step, THREAD, null, "no change for 5 ms", "unknown", null);
    expect(run.events).toEqual([
      { type: "attempt_lost", call: CALL, attempt: 3, reason: "no change for 5 ms" },
    ]);
    expect(run.lost()).toEqual([
      expect.objectContaining({
        attempt: 3,
        turn_id: null,
        reason: "no change for 5 ms",
        host_status: "unknown",
      }),
    ]);
  });
});
