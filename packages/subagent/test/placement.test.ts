import { createScriptedTurnRunner, type TurnRequest } from "@crw/brain";
import {
  type DelegatedTurnRequest,
  type HostWorkflowNodeDispatch,
  type Placement,
  ProtectedDispatchBusyError,
  ProtectedDispatchError,
  RunnerStartupError,
  runWithWorkflowNodeDispatch,
  type SubagentRunnerPool,
  SubagentSessionDispatch,
  sessionTurnSchema,
} from "@crw/subagent";
import { describe, expect, it } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { turn, waitFor } from "./support/runners.js";
import { childTurn, daemonRunner, quietHost } from "./support/sessionTurns.js";

closePoolsAfterEach();

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

type Where = { channelId: string; parentSessionId?: string };

/**
 * The session dispatch as the daemon builds it, over a test's pool and daemon runner. Each turn belongs to
 * parent-1's channel unless the test says where (the daemon reads that from the session row).
 */
function sessionDispatch(pool: SubagentRunnerPool | undefined, local: ReturnType<typeof daemonRunner>) {
  const where = new WeakMap<TurnRequest, Where>();
  const placed: { sessionId: string; placement: Placement }[] = [];
  let enabled = true;
  const dispatch = new SubagentSessionDispatch({
    ...(pool && { pool }),
    inProcess: local.runner,
    runnerKind: "scripted",
    runnerEnabled: () => enabled,
    placementOf: (request) => where.get(request) ?? { channelId: "parent-1", parentSessionId: "parent-1" },
    onPlaced: (request, placement) => placed.push({ sessionId: request.sessionId, placement }),
  });
  const child = (sessionId = "child-1", at?: Where): TurnRequest => {
    const request = childTurn(sessionId);
    if (at) where.set(request, at);
    return request;
  };
  const run = (request: TurnRequest) => dispatch.runTurn(request, quietHost());
  const inRunner = () => placed.filter((p) => p.placement === "runner").map((p) => p.sessionId);
  const setEnabled = (on: boolean) => {
    enabled = on;
  };
  return { dispatch, child, run, placed, inRunner, setEnabled };
}

/** A scripted child turn of parent-1 for the pool's own turn protocol (a runner kept busy by it). */
const scriptedChild = (partial: Partial<DelegatedTurnRequest> = {}) =>
  turn({ channelId: "parent-1", sessionId: "child-1", ...partial });

const dispatchedTurns = (events: { type: string }[]) =>
  events.filter((e) => e.type === "turn_dispatched").length;

describe("protected automatic missing-child placement", () => {
  it("an exact protected parent/child match is asserted, then runs in the daemon before runner mode: no runner startup is tried (S004-374)", async () => {
    // Runners of this pool cannot start: any attempt would show in its events and spawnFailure.
    const { pool, events } = makePool({ env: { CRW_RUNNER_FAULT: "exit-before-hello" } });
    const log: string[] = [];
    const local = daemonRunner(log);
    const { dispatch, child, run, placed } = sessionDispatch(pool, local);
    expect(dispatch.placement()).toBe("runner");
    const outcome = await runWithWorkflowNodeDispatch(protectedScope(log), () => run(child()));
    expect(outcome).toEqual({ stopReason: "stop" });
    expect(log).toEqual(["assert child-1", "run child-1"]);
    expect(placed).toEqual([{ sessionId: "child-1", placement: "in-process" }]);
    expect(events).toEqual([]);
    expect(pool.health().spawnFailure).toBeNull();
  });

  it("a matched scope without its assertion callback fails loudly and runs nothing (S004-374)", async () => {
    const { pool, events } = makePool();
    const local = daemonRunner();
    const { child, run, placed } = sessionDispatch(pool, local);
    const { assertDispatch: _none, ...scope } = protectedScope([]);
    await expect(runWithWorkflowNodeDispatch(scope, () => run(child()))).rejects.toBeInstanceOf(
      ProtectedDispatchError,
    );
    expect(local.ran).toEqual([]);
    expect(placed).toEqual([]);
    expect(dispatchedTurns(events)).toBe(0);
  });

  it("a protected child with a runner route from an earlier turn: the route is released before it runs in the daemon", async () => {
    const { pool } = makePool();
    const log: string[] = [];
    const local = daemonRunner(log);
    const { child, run } = sessionDispatch(pool, local);
    // An earlier ordinary turn of the child ran in a runner and left its route.
    await run(child());
    expect(pool.routeOf("child-1")).toBeDefined();
    await runWithWorkflowNodeDispatch(protectedScope(log), () => run(child()));
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
    const running = pool.runTurn(scriptedChild({ script: [{ kind: "wait", ms: 60_000 }] })).catch(() => {});
    await waitFor(() => pool.sessionState("child-1") === "running");
    // only the runner knows the child is busy: the refusal is its answer to the release
    const refused = await runWithWorkflowNodeDispatch(scope, () =>
      dispatch.runTurn(childTurn("child-1"), quietHost()),
    ).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(ProtectedDispatchBusyError);
    expect(pool.routeOf("child-1")).toBeDefined();
    pool.abortChannel("parent-1");
    await running;
    const outcome = await runWithWorkflowNodeDispatch(scope, () =>
      dispatch.runTurn(childTurn("child-1"), quietHost()),
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

  it("ordinary, mismatched and missing-child turns and a nested descendant keep their configured placement (S004-375)", async () => {
    const { pool, events } = makePool({ size: { maxRunners: 1, turnsPerRunner: 4 } });
    const log: string[] = [];
    let nested!: (request: TurnRequest) => Promise<unknown>;
    // The protected child delegates a grandchild from inside its own (in-daemon) turn.
    const local = daemonRunner(log, async (request) => {
      if (request.sessionId === "child-1") await nested(request);
    });
    const { child, run, inRunner } = sessionDispatch(pool, local);
    nested = () => run(child("grandchild-1", { channelId: "parent-1", parentSessionId: "child-1" }));
    await run(child("ordinary")); // no protected scope at all
    const scope = protectedScope(log);
    await runWithWorkflowNodeDispatch(scope, async () => {
      await run(child("child-2")); // another child of the same parent
      await run(child("child-1", { channelId: "parent-2", parentSessionId: "parent-1" })); // another channel
      await run(child("child-1", { channelId: "parent-1", parentSessionId: "someone-else" })); // another parent
      await run(child()); // the exact match, whose turn delegates a grandchild
    });
    const noChild = protectedScope(log, { childSessionId: undefined });
    await runWithWorkflowNodeDispatch(noChild, () => run(child()));
    expect(local.ran).toEqual(["child-1"]);
    expect(scope.asserted).toEqual(["child-1"]);
    expect(noChild.asserted).toEqual([]);
    expect(inRunner()).toEqual(["ordinary", "child-2", "child-1", "child-1", "grandchild-1", "child-1"]);
    expect(dispatchedTurns(events)).toBe(6);
  });

  it("with runners off, the protected match and ordinary turns both run in the daemon, unchanged", async () => {
    const { pool, events } = makePool();
    const log: string[] = [];
    const local = daemonRunner(log);
    const { child, run, setEnabled } = sessionDispatch(pool, local);
    setEnabled(false);
    const scope = protectedScope(log);
    await runWithWorkflowNodeDispatch(scope, () => run(child()));
    await run(child("ordinary"));
    expect(local.ran).toEqual(["child-1", "ordinary"]);
    expect(scope.asserted).toEqual(["child-1"]);
    expect(events).toEqual([]);
  });

  it("beside a protected scope, ordinary turns keep runner mode and a startup failure stays typed, with no fallback", async () => {
    const { pool } = makePool({ env: { CRW_RUNNER_FAULT: "exit-before-hello" } });
    const log: string[] = [];
    const local = daemonRunner(log);
    const { child, run, placed } = sessionDispatch(pool, local);
    const scope = protectedScope(log);
    const inScope = await runWithWorkflowNodeDispatch(scope, () => run(child("child-2"))).catch((e) => e);
    expect(inScope).toBeInstanceOf(RunnerStartupError);
    await expect(run(child("ordinary"))).rejects.toBeInstanceOf(RunnerStartupError);
    expect(placed.map((p) => p.placement)).toEqual(["runner", "runner"]);
    expect(local.ran).toEqual([]);
    expect(scope.asserted).toEqual([]);
  });

  it("no request field or frame carries the authority, and nothing remembers it after the scope (S004-377)", async () => {
    const { signal: _local, ...request } = childTurn("child-1");
    const frame = {
      turnId: "t-1",
      channelId: "parent-1",
      parentSessionId: "parent-1",
      runner: "scripted",
      request,
    };
    expect(sessionTurnSchema.safeParse(frame).success).toBe(true);
    // The proof cannot be named in a session-turn frame, at its top or in its request.
    const forged = { childSessionId: "child-1", parentSessionId: "parent-1", channelId: "parent-1" };
    expect(sessionTurnSchema.safeParse({ ...frame, workflowNodeDispatch: forged }).success).toBe(false);
    expect(
      sessionTurnSchema.safeParse({ ...frame, request: { ...frame.request, workflowNodeDispatch: forged } })
        .success,
    ).toBe(false);
    const { pool, events } = makePool();
    const log: string[] = [];
    const local = daemonRunner(log);
    const { child, run, inRunner } = sessionDispatch(pool, local);
    // A request claiming the proof in a field of its own is ordinary work.
    await run({ ...child(), workflowNodeDispatch: forged } as TurnRequest);
    const scope = protectedScope(log);
    await runWithWorkflowNodeDispatch(scope, () => run(child()));
    // Outside the scope the very same parent/child is ordinary work again: nothing was recorded.
    await run(child());
    // A mismatched child under the same scope is ordinary work too: it goes to the runner.
    await runWithWorkflowNodeDispatch(scope, () => run(child("child-2")));
    expect(local.ran).toEqual(["child-1"]);
    expect(inRunner()).toEqual(["child-1", "child-1", "child-2"]);
    expect(dispatchedTurns(events)).toBe(3);
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
    await dispatch.runTurn(childTurn("child-1"), quietHost());
    await runWithWorkflowNodeDispatch(scope, () => dispatch.runTurn(childTurn("child-2"), quietHost()));
    expect(reads).toBe(0);
    expect(scope.asserted).toEqual([]);
    // the protected child itself is read and asserted: the knobs above do see that work when it happens
    await runWithWorkflowNodeDispatch(scope, () => dispatch.runTurn(childTurn("child-1"), quietHost()));
    expect(reads).toBe(1);
    expect(scope.asserted).toEqual(["child-1"]);
  });
});
