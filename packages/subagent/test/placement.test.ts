import {
  captureDelegatedExecutionScope,
  createScriptedTurnRunner,
  parseDelegatedExecutionScope,
  type TurnHost,
  type TurnRequest,
} from "@crw/brain";
import {
  type ChildTurnExecutor,
  type DelegatedTurnRequest,
  delegatedTurnRequestSchema,
  type HostWorkflowNodeDispatch,
  ProtectedDispatchBusyError,
  ProtectedDispatchError,
  RunnerStartupError,
  runWithWorkflowNodeDispatch,
  ScriptedTurnExecutor,
  SkillReviewSkippedError,
  SubagentDispatch,
  SubagentSessionDispatch,
} from "@crw/subagent";
import { describe, expect, it } from "vitest";
import { closePoolsAfterEach, effectsFile, makePool } from "./support/pools.js";
import { turn, waitFor } from "./support/runners.js";

closePoolsAfterEach();

/** The daemon's own executor, recording which child turns ran in the daemon and in what order. */
function inProcess(log: string[] = [], nested?: (request: DelegatedTurnRequest) => Promise<void>) {
  const ran: string[] = [];
  const scripted = new ScriptedTurnExecutor();
  const executor: ChildTurnExecutor = {
    runTurn: async (request, ctx) => {
      ran.push(request.sessionId);
      log.push(`run ${request.sessionId}`);
      await nested?.(request);
      return scripted.runTurn(request, ctx);
    },
  };
  return { executor, ran };
}

/** A protected scope whose assertion (the controlled native boundary) records when it is awaited. */
function protectedScope(
  log: string[],
  scope: Partial<HostWorkflowNodeDispatch> = {},
): HostWorkflowNodeDispatch & { asserted: string[] } {
  const asserted: string[] = [];
  return {
    parentSessionId: "parent-1",
    channelId: "parent-1",
    childSessionId: "child-1",
    assertDispatch: async (child) => {
      await new Promise((r) => setTimeout(r, 20));
      asserted.push(child);
      log.push(`assert ${child}`);
    },
    ...scope,
    asserted,
  };
}

const child = (partial: Partial<DelegatedTurnRequest> = {}) =>
  turn({ channelId: "parent-1", sessionId: "child-1", ...partial });

/** A delegated child's session turn (it carries its durable scope), as the delegation core hands it over. */
const sessionTurn = (sessionId: string): TurnRequest => ({
  sessionId,
  principalAccountId: "acct-1",
  model: "scripted",
  systemPrompt: "You are a worker.",
  context: [{ role: "user", content: "hi" }],
  tools: [],
  scope: parseDelegatedExecutionScope(
    captureDelegatedExecutionScope({ accountId: "acct-1", target: { kind: "host", ref: null } }),
  ),
  readOnly: false,
  workDir: null,
  signal: new AbortController().signal,
});

const quietHost: TurnHost = {
  record: async () => {},
  beforeToolCall: async () => {},
  drainSteering: async () => [],
  progress: () => {},
};

const dispatchedSessions = (events: { type: string }[]) =>
  events.flatMap((e) => (e.type === "turn_dispatched" ? [e] : [])).length;

describe("optional skill-review children", () => {
  it("SubagentDispatch.send checks skill-review first, before a protected match (S004-373)", async () => {
    const { pool, events } = makePool();
    const log: string[] = [];
    const local = inProcess(log);
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    await dispatch.send(turn({ sessionId: "warm" })); // a ready runner with a free slot
    const scope = protectedScope(log);
    // The same exact parent/child as the protected scope, but a skill review: it is runner-only.
    const review = await runWithWorkflowNodeDispatch(scope, () =>
      dispatch.send(child({ purpose: "skill-review", script: [{ kind: "text", text: "review notes" }] })),
    );
    expect(review.text).toBe("review notes");
    expect(scope.asserted).toEqual([]);
    expect(local.ran).toEqual([]);
    expect(dispatchedSessions(events)).toBe(2);
  });

  it("with the runner disabled, optional skill reviews skip instead of running in the daemon (S004-442)", async () => {
    const effects = await effectsFile();
    const { pool, events } = makePool();
    const local = inProcess();
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor, runnerEnabled: () => false });
    const error = await dispatch
      .send(
        turn({
          purpose: "skill-review",
          script: [{ kind: "appendFile", path: effects.path, line: "review" }],
        }),
      )
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(SkillReviewSkippedError);
    expect(error).toMatchObject({ reason: "runner_disabled", code: "skill_review_skipped" });
    expect(local.ran).toEqual([]);
    expect(await effects.lines()).toEqual([]);
    expect(events).toEqual([]);
    // Ordinary work with the runner off is the in-process rollback, as before.
    await dispatch.send(turn({ sessionId: "ordinary" }));
    expect(local.ran).toEqual(["ordinary"]);
  });

  it("a full pool skips a skill review without queueing it; ordinary work still queues (S004-356)", async () => {
    const { pool } = makePool({ size: { maxRunners: 1, turnsPerRunner: 1 } });
    const local = inProcess();
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    // No runner started yet: a review does not start one for itself.
    await expect(dispatch.send(turn({ purpose: "skill-review" }))).rejects.toMatchObject({
      reason: "runner_unavailable",
    });
    expect(pool.health().runners).toHaveLength(0);
    const busy = dispatch.send(turn({ sessionId: "busy", script: [{ kind: "wait", ms: 400 }] }));
    await waitFor(() => pool.sessionState("busy") === "running");
    await expect(dispatch.send(turn({ purpose: "skill-review" }))).rejects.toMatchObject({
      reason: "runner_full",
    });
    expect(pool.health().queued).toBe(0);
    const queued = dispatch.send(turn({ sessionId: "interactive" }));
    await waitFor(() => pool.sessionState("interactive") === "queued");
    // A queued interactive turn is never overtaken, even when a slot frees up.
    await expect(dispatch.send(turn({ purpose: "skill-review" }))).rejects.toMatchObject({
      reason: "runner_full",
    });
    await Promise.all([busy, queued]);
    expect(local.ran).toEqual([]);
  });

  it("startup failure keeps its typed error for ordinary work (no fallback) and makes a review skip as incompatible (S004-356)", async () => {
    const { pool } = makePool({ buildId: "crw-runner-not-this-one" });
    const local = inProcess();
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    await expect(dispatch.send(turn())).rejects.toBeInstanceOf(RunnerStartupError);
    await expect(dispatch.send(turn({ purpose: "skill-review" }))).rejects.toMatchObject({
      name: "SkillReviewSkippedError",
      reason: "runner_incompatible",
    });
    expect(local.ran).toEqual([]);
  });
});

describe("protected automatic missing-child placement", () => {
  it("an exact protected parent/child match is asserted, then runs in the daemon under the fence before runner mode (S004-374)", async () => {
    const { pool, events } = makePool({ env: { CRW_RUNNER_FAULT: "exit-before-hello" } });
    const log: string[] = [];
    const local = inProcess(log);
    const dispatch = new SubagentDispatch({
      pool,
      inProcess: local.executor,
      fence: async (request, work) => {
        log.push(`fence ${request.sessionId}`);
        try {
          return await work();
        } finally {
          log.push(`unfence ${request.sessionId}`);
        }
      },
    });
    expect(dispatch.placement()).toBe("runner");
    const scope = protectedScope(log);
    const result = await runWithWorkflowNodeDispatch(scope, () =>
      dispatch.send(child({ script: [{ kind: "text", text: "recovered in the daemon" }] })),
    );
    expect(result.text).toBe("recovered in the daemon");
    expect(log).toEqual(["assert child-1", "fence child-1", "run child-1", "unfence child-1"]);
    // Runner mode was never entered: no startup was attempted, though this pool's runners cannot start.
    expect(events).toEqual([]);
    expect(pool.health().spawnFailure).toBeNull();
  });

  it("a protected child with a runner route from an earlier turn: the route is released before it runs in the daemon", async () => {
    const { pool } = makePool();
    const log: string[] = [];
    const local = inProcess(log);
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    // An earlier ordinary turn of the child ran in a runner and left its route.
    await dispatch.send(child({ script: [{ kind: "text", text: "first turn in a runner" }] }));
    expect(pool.routeOf("child-1")).toBeDefined();
    const result = await runWithWorkflowNodeDispatch(protectedScope(log), () =>
      dispatch.send(child({ script: [{ kind: "text", text: "continued in the daemon" }] })),
    );
    expect(result.text).toBe("continued in the daemon");
    expect(local.ran).toEqual(["child-1"]);
    expect(pool.routeOf("child-1")).toBeUndefined();
  });

  it("the pool hands a channel back through release: a protected session turn asks the runner first (busy refuses, released drops the route), and a reset releases the idle routes (S004-527)", async () => {
    const { pool } = makePool({ size: { maxRunners: 1, turnsPerRunner: 2 } });
    const log: string[] = [];
    const scope = protectedScope(log);
    const dispatch = new SubagentSessionDispatch({
      pool,
      inProcess: createScriptedTurnRunner(),
      runnerKind: "scripted",
      placementOf: () => ({ channelId: "parent-1", parentSessionId: "parent-1" }),
    });
    const running = pool.runTurn(child({ script: [{ kind: "wait", ms: 60_000 }] })).catch(() => {});
    await waitFor(() => pool.sessionState("child-1") === "running");
    // only the runner knows the child is busy: the refusal is its answer to the release
    const refused = await runWithWorkflowNodeDispatch(scope, () =>
      dispatch.runTurn(sessionTurn("child-1"), quietHost),
    ).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(ProtectedDispatchBusyError);
    expect(pool.routeOf("child-1")).toBeDefined();
    pool.abortChannel("parent-1");
    await running;
    const outcome = await runWithWorkflowNodeDispatch(scope, () =>
      dispatch.runTurn(sessionTurn("child-1"), quietHost),
    );
    expect(outcome.stopReason).toBe("stop");
    expect(pool.routeOf("child-1")).toBeUndefined();
    // a reset (the mode toggle) hands every routed session back the same way, on a runner kept alive by a
    // busy session: the idle one is released, the busy one keeps its route
    const busy = pool
      .runTurn(turn({ sessionId: "busy", channelId: "parent-2", script: [{ kind: "wait", ms: 60_000 }] }))
      .catch(() => {});
    await waitFor(() => pool.sessionState("busy") === "running");
    await pool.runTurn(turn({ sessionId: "idle", channelId: "parent-2" }));
    expect(pool.routeOf("idle")).toBe(pool.routeOf("busy"));
    await pool.reset();
    expect(pool.routeOf("idle")).toBeUndefined();
    expect(pool.routeOf("busy")).toBeDefined();
    pool.abortChannel("parent-2");
    await busy;
  });

  it("a protected child still running a turn in its runner is refused (busy), not run twice; its route stays", async () => {
    const { pool } = makePool({ size: { maxRunners: 1, turnsPerRunner: 2 } });
    const log: string[] = [];
    const local = inProcess(log);
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    const running = dispatch.send(child({ script: [{ kind: "wait", ms: 60_000 }] }));
    await waitFor(() => pool.sessionState("child-1") === "running");
    const refused = await runWithWorkflowNodeDispatch(protectedScope(log), () =>
      dispatch.send(child({ script: [{ kind: "text", text: "must not run" }] })),
    ).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(ProtectedDispatchBusyError);
    expect(refused).toMatchObject({ code: "session_busy" });
    expect(local.ran).toEqual([]);
    expect(pool.routeOf("child-1")).toBeDefined();
    pool.abortChannel("parent-1");
    await running.catch(() => {});
  });

  it("a matched scope without its assertion callback fails loudly and runs nothing (S004-374)", async () => {
    const { pool } = makePool();
    const local = inProcess();
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    const { assertDispatch: _none, ...scope } = protectedScope([]);
    await expect(runWithWorkflowNodeDispatch(scope, () => dispatch.send(child()))).rejects.toBeInstanceOf(
      ProtectedDispatchError,
    );
    expect(local.ran).toEqual([]);
  });

  it("mismatched or missing child, other parents and nested descendants keep their configured placement (S004-375)", async () => {
    const { pool, events } = makePool({ size: { maxRunners: 1, turnsPerRunner: 4 } });
    const log: string[] = [];
    let dispatch!: SubagentDispatch;
    // The protected child delegates a grandchild from inside its own (in-daemon) turn.
    const local = inProcess(log, async (request) => {
      if (request.sessionId !== "child-1") return;
      await dispatch.send(
        turn({ channelId: "parent-1", sessionId: "grandchild-1", parentSessionId: "child-1" }),
      );
    });
    dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    const scope = protectedScope(log);
    await runWithWorkflowNodeDispatch(scope, async () => {
      await dispatch.send(child({ sessionId: "child-2" })); // another child of the same parent
      await dispatch.send(child({ channelId: "parent-2" })); // the same child id under another channel
      await dispatch.send(child({ parentSessionId: "someone-else" })); // another parent
      await dispatch.send(child()); // the exact match, whose turn delegates a grandchild
    });
    const noChild = protectedScope(log, { childSessionId: undefined });
    await runWithWorkflowNodeDispatch(noChild, () => dispatch.send(child()));
    expect(local.ran).toEqual(["child-1"]);
    expect(scope.asserted).toEqual(["child-1"]);
    expect(noChild.asserted).toEqual([]);
    // Three mismatches, the grandchild and the missing-child scope's call all ran in the runner.
    expect(dispatchedSessions(events)).toBe(5);
  });

  it("with runners off, the protected match and ordinary calls both run in the daemon, unchanged (S004-356)", async () => {
    const { pool, events } = makePool();
    const log: string[] = [];
    const local = inProcess(log);
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor, runnerEnabled: () => false });
    const scope = protectedScope(log);
    await runWithWorkflowNodeDispatch(scope, () => dispatch.send(child()));
    await dispatch.send(turn({ sessionId: "ordinary" }));
    expect(local.ran).toEqual(["child-1", "ordinary"]);
    expect(scope.asserted).toEqual(["child-1"]);
    expect(events).toEqual([]);
  });

  it("no request field or RPC carries the authority, and no registry remembers it (S004-377)", async () => {
    const { pool, events } = makePool();
    const log: string[] = [];
    const local = inProcess(log);
    const dispatch = new SubagentDispatch({ pool, inProcess: local.executor });
    // The proof cannot be named in a request: the frame schema refuses any such field.
    const forged = { ...child(), workflowNodeDispatch: { childSessionId: "child-1" } };
    expect(delegatedTurnRequestSchema.safeParse(forged).success).toBe(false);
    const scope = protectedScope(log);
    await runWithWorkflowNodeDispatch(scope, () => dispatch.send(child()));
    // Outside the scope the very same parent/child is ordinary work again: nothing was recorded.
    await dispatch.send(child());
    // A mismatched child under the same scope is ordinary work too: it goes to the runner.
    await runWithWorkflowNodeDispatch(scope, () => dispatch.send(child({ sessionId: "child-2" })));
    expect(local.ran).toEqual(["child-1"]);
    expect(dispatchedSessions(events)).toBe(2);
  });

  it("with no protected scope, or one for another child, a session turn makes no assertion and no placement read (S004-378)", async () => {
    const log: string[] = [];
    const scope = protectedScope(log);
    let reads = 0;
    const dispatch = new SubagentSessionDispatch({
      inProcess: createScriptedTurnRunner(),
      runnerEnabled: () => false,
      placementOf: () => {
        reads++;
        return { channelId: "parent-1", parentSessionId: "parent-1" };
      },
    });
    await dispatch.runTurn(sessionTurn("child-1"), quietHost);
    await runWithWorkflowNodeDispatch(scope, () => dispatch.runTurn(sessionTurn("child-2"), quietHost));
    expect(reads).toBe(0);
    expect(scope.asserted).toEqual([]);
    // the protected child itself is read and asserted: the knobs above do see that work when it happens
    await runWithWorkflowNodeDispatch(scope, () => dispatch.runTurn(sessionTurn("child-1"), quietHost));
    expect(reads).toBe(1);
    expect(scope.asserted).toEqual(["child-1"]);
  });
});
