import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { RemoteTurnError, SubagentRunnerPool } from "@crw/subagent";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import {
  type Daemon,
  delegatedWorkflowExpansionAvailable,
  loadConfig,
  ownerTokenPath,
  startDaemon,
} from "../src/index.js";
import { steps, TestClient } from "./support/client.js";
import { ownerHealth } from "./support/health.js";
import {
  allUserText,
  gate,
  type LoopbackProvider,
  lastUserText,
  startLoopbackProvider,
} from "./support/provider.js";
import { waitFor } from "./support/wait.js";

/**
 * The daemon's runner wiring, in one daemon with real forked runners, a real PostgreSQL and a model provider
 * on loopback (OpenAI Chat Completions over SSE) that the runners' agent loops reach through the daemon's
 * configured base URL.
 */
const silent = pino({ level: "silent" });
const db = useTestDatabase();
const KEY_VAR = "CRW_TEST_LOOPBACK_KEY";
const MODEL = "openai-completions:loopback-m";
const holds = new Map<string, ReturnType<typeof gate>>();
let provider: LoopbackProvider;
let daemon: Daemon;
let owner: TestClient;
const placed: { sessionId: string; placement: string }[] = [];

beforeAll(async () => {
  process.env[KEY_VAR] = "loopback-secret";
  provider = await startLoopbackProvider(async (request) => {
    const text = lastUserText(request);
    // The steering scenario: the child delegates (its tool round), the grandchild waits on a gate.
    if (allUserText(request).includes("STEER-CHILD")) {
      const toolRound = (request.body.messages ?? []).some((m) => m.role === "tool");
      if (!toolRound)
        return {
          tool: {
            id: "call-steer",
            name: "Delegate",
            arguments: { task: "STEER-GRAND work", background: false },
          },
        };
      return { text: "child done after steering" };
    }
    for (const [marker, g] of holds) if (text.includes(marker)) await g.wait;
    return { text: `answered: ${text.slice(-60)}` };
  });
  const dataDir = scratchDir("crw-daemon-wiring-");
  daemon = await startDaemon(
    loadConfig({
      env: { DATABASE_URL: db.url },
      overrides: {
        dataDir,
        port: 0,
        logLevel: "silent",
        runtime: { maxRunners: 2, turnsPerRunner: 8, maxActiveNodes: 1 },
        models: {
          baseUrls: { "openai-completions": provider.baseUrl },
          apiKeyEnv: { "openai-completions": KEY_VAR },
        },
      },
    }),
    {
      log: silent,
      observeTurn: (request, placement) => placed.push({ sessionId: request.sessionId, placement }),
    },
  );
  owner = await TestClient.connect(daemon.state.url, readFileSync(ownerTokenPath(dataDir), "utf8").trim());
});

afterAll(async () => {
  for (const g of holds.values()) g.open();
  owner?.close();
  await daemon?.stop();
  await provider?.close();
});

describe("the daemon's runner pool wiring", () => {
  it("a delegated child runs in a runner against the daemon's configured provider URL and key variable", async () => {
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
    const before = provider.requests.length;
    const receipt = await owner.ok<{ kind: string; childSessionId: string; body: string }>(
      "session.delegate",
      {
        sessionId,
        task: "loopback task one",
        model: MODEL,
      },
    );
    expect(receipt.kind).toBe("result");
    expect(receipt.body).toContain("answered:");
    const seen = provider.requests.slice(before);
    expect(seen.length).toBeGreaterThanOrEqual(1);
    expect(seen[0]).toMatchObject({
      path: "/v1/chat/completions",
      authorization: "Bearer loopback-secret",
      body: { model: "loopback-m" },
    });
    // The child's turn was placed in a runner (not in the daemon), and the pool routes it there.
    expect(placed.filter((p) => p.sessionId === receipt.childSessionId).map((p) => p.placement)).toEqual([
      "runner",
    ]);
    expect(daemon.runtime.executionFor(receipt.childSessionId)).toMatchObject({ location: "runner" });
  });

  it("the daemon's provider-usage sink: each provider response of a runner turn is recorded and published (S004-507)", async () => {
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
    const usageBefore = daemon.runtime.health().providerUsage.responses;
    const published: { type: string; sessionId: string }[] = [];
    // The child session is created by the call: listen on every session topic the call publishes to.
    const bus = daemon.runtime.bus;
    const original = bus.publish.bind(bus);
    bus.publish = (topic: string, event: unknown) => {
      if ((event as { type?: string }).type === "provider_usage")
        published.push(event as { type: string; sessionId: string });
      original(topic, event);
    };
    const receipt = await owner
      .ok<{ childSessionId: string }>("session.delegate", {
        sessionId,
        task: "loopback task for usage",
        model: MODEL,
      })
      .finally(() => {
        bus.publish = original;
      });
    const rows = async () =>
      (
        await db.pool.query(
          `select runner_id, api, provider, model, stop_reason, input_tokens::int as input,
                  output_tokens::int as output, total_tokens::int as total
             from provider_usage where session_id = $1 order by id`,
          [receipt.childSessionId],
        )
      ).rows;
    await waitFor(async () => (await rows()).length === 1, "the usage row");
    // The loopback server reports 7 prompt and 2 completion tokens per response.
    expect(await rows()).toEqual([
      {
        runner_id: expect.stringMatching(/^runner-/),
        api: "openai-completions",
        provider: "openai",
        model: "loopback-m",
        stop_reason: "stop",
        input: 7,
        output: 2,
        total: 9,
      },
    ]);
    expect(daemon.runtime.health().providerUsage.responses).toBe(usageBefore + 1);
    expect(published).toEqual([
      expect.objectContaining({ type: "provider_usage", sessionId: receipt.childSessionId }),
    ]);
    // The offline scripted provider reports nothing: a scripted child adds no row.
    const scripted = await owner.ok<{ childSessionId: string }>("session.delegate", {
      sessionId,
      task: steps({ text: "scripted answer" }),
    });
    const { rows: none } = await db.pool.query(
      "select count(*)::int as n from provider_usage where session_id = $1",
      [scripted.childSessionId],
    );
    expect(none[0].n).toBe(0);
  });

  it("session.status and /health merge a child's execution location with its delegation and process projections (S004-484)", async () => {
    const hold = gate();
    holds.set("HOLD-STATUS", hold);
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
    const receipt = await owner.ok<{ kind: string; childSessionId: string; runId: string }>(
      "session.delegate",
      {
        sessionId,
        task: "HOLD-STATUS child work",
        model: MODEL,
        background: true,
      },
    );
    expect(receipt.kind).toBe("started");
    const child = receipt.childSessionId;
    await waitFor(
      () => provider.requests.some((r) => lastUserText(r).includes("HOLD-STATUS")),
      "the child's request",
    );
    const status = await owner.ok<Record<string, unknown>>("session.status", { sessionId: child });
    const execution = status.execution as { location: string; runnerId: string; state: string };
    expect(execution).toEqual({
      location: "runner",
      runnerId: expect.stringMatching(/^runner-/),
      state: "running",
    });
    expect(status).toMatchObject({
      sessionId: child,
      kind: "delegated",
      parentSessionId: sessionId,
      delegation: { runId: receipt.runId, status: "running", mode: "background" },
      process: { runnerId: execution.runnerId, turns: expect.any(Number) },
    });
    expect(JSON.stringify(status)).not.toMatch(/"pid"/);
    const health = (await ownerHealth(daemon.state.url, daemon.config.dataDir)) as {
      executions: { sessionId: string; location: string; runnerId?: string; state: string }[];
    };
    expect(health.executions).toContainEqual({
      sessionId: child,
      location: "runner",
      runnerId: execution.runnerId,
      state: "running",
    });
    // A root session's turn runs in the daemon's own process: its location says so while it runs.
    const root = await owner.ok<{ sessionId: string }>("session.create", { model: MODEL });
    const rootHold = gate();
    holds.set("HOLD-ROOT", rootHold);
    const sending = owner.ok("session.send", { sessionId: root.sessionId, text: "HOLD-ROOT hello" });
    await waitFor(
      () => provider.requests.some((r) => lastUserText(r).includes("HOLD-ROOT")),
      "the root's request",
    );
    expect(await owner.ok("session.status", { sessionId: root.sessionId })).toMatchObject({
      kind: "root",
      execution: { location: "in-process", state: "running" },
      delegation: null,
      process: null,
    });
    rootHold.open();
    await sending;
    expect(daemon.runtime.executionFor(root.sessionId)).toEqual({ location: "none" });
    // Once the child's call settles, its delegation projection is gone and its runner route is idle.
    hold.open();
    await waitFor(async () => {
      const s = await owner.ok<{ delegation: unknown }>("session.status", { sessionId: child });
      return s.delegation === null;
    }, "the child's call to settle");
    expect(
      (await owner.ok<{ execution: unknown }>("session.status", { sessionId: child })).execution,
    ).toEqual({
      location: "runner",
      runnerId: execution.runnerId,
      state: "idle",
    });
    // Another account's session is not found, as for every session method.
    const other = await owner.call("session.status", { sessionId: randomUUID() });
    expect(other.error).toMatchObject({ data: { code: "not_found" } });
  });

  it("expansion is offered to a runner child when the pool has the host-call handler; workflow.addNodes from a forked runner extends the running node's workflow (S004-500)", async () => {
    const hold = gate();
    holds.set("HOLD-NODE-A", hold);
    const definition = JSON.stringify({
      name: "expand",
      defaults: { model: MODEL },
      nodes: [{ id: "a", task: "HOLD-NODE-A first node work" }],
    });
    const started = await owner.ok<{ workflowId: string; nodes: string[] }>("workflow.start", {
      definition,
      format: "json",
    });
    await waitFor(
      () => provider.requests.some((r) => lastUserText(r).includes("HOLD-NODE-A")),
      "node a's request",
    );
    // The node's child runs in a runner, and its provider request offers WorkflowAddNodes.
    const request = provider.requests.find((r) => lastUserText(r).includes("HOLD-NODE-A"));
    const toolNames = (request?.body.tools ?? []).map((t) => t.function?.name);
    expect(toolNames).toContain("WorkflowAddNodes");
    const node = daemon.runtime
      .executions()
      .find(
        (e) =>
          e.location === "runner" &&
          e.state === "running" &&
          daemon.runtime.engine.nodeOfSession(e.sessionId),
      );
    expect(node).toBeDefined();
    const childSession = node?.sessionId as string;
    const pool = daemon.runtime.runnerPool;
    const addNodes = (sessionId: string, id: string) =>
      pool.runTurn({
        turnId: `t-${randomUUID()}`,
        channelId: `host-call-${id}`,
        sessionId,
        prompt: "extend the workflow",
        script: [
          {
            kind: "hostRpc",
            method: "workflow.addNodes",
            params: {
              workflowId: started.workflowId,
              nodes: [{ id, prompt: `added node ${id} work`, dependsOn: ["a"] }],
            },
          },
        ],
      });
    // A session that is no running node of this workflow is refused, typed, and nothing is added.
    const refused = await addNodes(randomUUID(), "intruder").catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(RemoteTurnError);
    expect((refused as Error).message).toMatch(/not a running node/);
    // The node's own session, through a real forked runner's host call.
    const done = await addNodes(childSession, "b");
    expect(done.stopReason).toBe("end");
    const status = await owner.ok<{ nodes: { id: string }[] }>("workflow.status", {
      workflowId: started.workflowId,
    });
    expect(status.nodes.map((n) => n.id).sort()).toEqual(["a", "b"]);
    hold.open();
    const followed = await owner.ok<{ status: string; nodes: { id: string; status: string }[] }>(
      "workflow.follow",
      { workflowId: started.workflowId },
    );
    expect(followed.status).toBe("completed");
    expect(followed.nodes.map((n) => [n.id, n.status]).sort()).toEqual([
      ["a", "succeeded"],
      ["b", "succeeded"],
    ]);
  });

  it("a Delegate call's child and a workflow node's child go through the daemon's one dispatch into the same runner pool (S004-149)", async () => {
    const hold = gate();
    holds.set("HOLD-SAME-NODE", hold);
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
    const delegated = await owner.ok<{ childSessionId: string }>("session.delegate", {
      sessionId,
      task: "same dispatch delegate work",
      model: MODEL,
    });
    const definition = JSON.stringify({
      name: "same-dispatch",
      defaults: { model: MODEL },
      nodes: [{ id: "n", task: "HOLD-SAME-NODE node work" }],
    });
    const started = await owner.ok<{ workflowId: string }>("workflow.start", { definition, format: "json" });
    await waitFor(
      () => provider.requests.some((r) => lastUserText(r).includes("HOLD-SAME-NODE")),
      "the node's request",
    );
    const nodeChild = daemon.runtime
      .executions()
      .find((e) => daemon.runtime.engine.nodeOfSession(e.sessionId)?.workflowId === started.workflowId);
    expect(nodeChild).toMatchObject({ location: "runner", state: "running" });
    const nodeSession = nodeChild?.sessionId as string;
    // The dispatch's own placement decision saw both children, and the one pool routes both.
    const placementsOf = (id: string) => placed.filter((p) => p.sessionId === id).map((p) => p.placement);
    expect(placementsOf(delegated.childSessionId)).toEqual(["runner"]);
    expect(placementsOf(nodeSession)).toEqual(["runner"]);
    const pool = daemon.runtime.runnerPool;
    expect(pool.routeOf(nodeSession)).toEqual(expect.stringMatching(/^runner-/));
    expect(pool.routeOf(delegated.childSessionId)).toEqual(expect.stringMatching(/^runner-/));
    hold.open();
    const done = await owner.ok<{ status: string }>("workflow.follow", { workflowId: started.workflowId });
    expect(done.status).toBe("completed");
  });

  it("runtime.maxActiveNodes reaches the workflow engine: with a cap of one, independent nodes run one at a time", async () => {
    const gx = gate();
    const gy = gate();
    holds.set("HOLD-CAP-X", gx);
    holds.set("HOLD-CAP-Y", gy);
    const definition = JSON.stringify({
      name: "capped",
      defaults: { model: MODEL },
      nodes: [
        { id: "x", task: "HOLD-CAP-X work" },
        { id: "y", task: "HOLD-CAP-Y work" },
      ],
    });
    const started = await owner.ok<{ workflowId: string }>("workflow.start", { definition, format: "json" });
    const asked = (m: string) => provider.requests.some((r) => lastUserText(r).includes(m));
    await waitFor(() => asked("HOLD-CAP-X") || asked("HOLD-CAP-Y"), "the first node's request");
    const [first, second] = asked("HOLD-CAP-X") ? [gx, gy] : [gy, gx];
    const secondMarker = asked("HOLD-CAP-X") ? "HOLD-CAP-Y" : "HOLD-CAP-X";
    // While the first node holds the only slot, the second node's child is never prompted.
    await new Promise((r) => setTimeout(r, 500));
    expect(asked(secondMarker)).toBe(false);
    expect(daemon.runtime.engine.activeNodes()).toBe(1);
    first.open();
    await waitFor(() => asked(secondMarker), "the second node's request");
    second.open();
    const done = await owner.ok<{ status: string }>("workflow.follow", { workflowId: started.workflowId });
    expect(done.status).toBe("completed");
  });

  it("a pool without the host-call handler withholds WorkflowAddNodes from a workflow node's runner child (S004-500 S004-501)", async () => {
    const hold = gate();
    holds.set("HOLD-NO-HANDLER", hold);
    const pool = daemon.runtime.runnerPool;
    // The daemon's own pool always has the handler: its capability report is what the daemon reads.
    const capability = vi.spyOn(pool, "supportsHostRpc").mockReturnValue(false);
    let workflowId: string | undefined;
    try {
      const definition = JSON.stringify({
        name: "no-handler",
        defaults: { model: MODEL },
        nodes: [{ id: "n", task: "HOLD-NO-HANDLER node work" }],
      });
      ({ workflowId } = await owner.ok<{ workflowId: string }>("workflow.start", {
        definition,
        format: "json",
      }));
      await waitFor(
        () => provider.requests.some((r) => lastUserText(r).includes("HOLD-NO-HANDLER")),
        "the node's request",
      );
      const nodeChild = daemon.runtime
        .executions()
        .find((e) => daemon.runtime.engine.nodeOfSession(e.sessionId)?.workflowId === workflowId);
      expect(nodeChild).toMatchObject({ location: "runner", state: "running" });
      const request = provider.requests.find((r) => lastUserText(r).includes("HOLD-NO-HANDLER"));
      const toolNames = (request?.body.tools ?? []).map((t) => t.function?.name);
      expect(toolNames).toContain("WorkflowStart");
      expect(toolNames).not.toContain("WorkflowAddNodes");
      expect(capability).toHaveBeenCalled();
    } finally {
      capability.mockRestore();
      hold.open();
    }
    const done = await owner.ok<{ status: string }>("workflow.follow", { workflowId });
    expect(done.status).toBe("completed");
  });

  it("the daemon's decision reads supportsHostRpc(): without the handler a runner child gets no expansion (S004-500 S004-501)", () => {
    const base = {
      sizing: () => ({ maxRunners: 1, turnsPerRunner: 1 }),
      retryPolicySource: () => {
        throw new Error("not started in this test");
      },
      catalog: () => ({ revision: 1, public: [], accounts: {} }),
    };
    const withHandler = new SubagentRunnerPool({ ...base, hostRpc: async () => null });
    const without = new SubagentRunnerPool(base);
    expect(delegatedWorkflowExpansionAvailable("runner", withHandler)).toBe(true);
    expect(delegatedWorkflowExpansionAvailable("runner", without)).toBe(false);
    // In the daemon's own process the tool runs locally: no host call is needed.
    expect(delegatedWorkflowExpansionAvailable("in-process", without)).toBe(true);
    // The daemon's pool has the handler.
    expect(daemon.runtime.runnerPool.supportsHostRpc()).toBe(true);
  });

  it("a runner's result-delivered host call reaches the daemon's publisher, which re-reads the journal before fanning out (S004-507 S004-510)", async () => {
    // A parent with one delivered result (a foreground Delegate's tool result carries its resultId).
    const { sessionId: parent } = await owner.ok<{ sessionId: string }>("session.create");
    await owner.ok("session.send", {
      sessionId: parent,
      text: steps(
        { toolCalls: [{ name: "Delegate", arguments: { task: "small job", background: false } }] },
        { text: "ok" },
      ),
    });
    const who = await owner.ok<{ accountId: string }>("daemon.whoami");
    const [resultId] = await daemon.runtime.repo.settledResultIds(parent, who.accountId);
    expect(resultId).toBeDefined();
    const { sessionId: stranger } = await owner.ok<{ sessionId: string }>("session.create");

    const published: { parent: string; event: unknown }[] = [];
    const offs = [parent, stranger].map((s) =>
      daemon.runtime.bus.subscribe(`session:${s}`, (event) => {
        if ((event as { type?: string }).type === "result_delivered") published.push({ parent: s, event });
      }),
    );
    const deliver = (sessionId: string) =>
      daemon.runtime.runnerPool.runTurn({
        turnId: `t-${randomUUID()}`,
        channelId: `deliver-${sessionId}`,
        sessionId,
        prompt: "report the delivery",
        script: [
          {
            kind: "hostRpc",
            method: "delegation.resultDelivered",
            params: {
              parentSessionId: sessionId,
              results: [{ resultId: resultId as string, toolCallId: "call-1", kind: "result" }],
            },
          },
        ],
      });
    try {
      // The journal of `stranger` holds no such delivery: the row says otherwise, nothing is published.
      expect((await deliver(stranger)).stopReason).toBe("end");
      expect(published).toEqual([]);
      // The real parent's journal proves it: published once, before the host call answered.
      expect((await deliver(parent)).stopReason).toBe("end");
      expect(published).toEqual([
        {
          parent,
          event: {
            type: "result_delivered",
            parentSessionId: parent,
            results: [{ resultId, toolCallId: "call-1", kind: "result" }],
          },
        },
      ]);
    } finally {
      for (const off of offs) off();
    }
  });

  it("a background result the delegation core delivers into an idle parent is published once to the parent's live views", async () => {
    const { sessionId: parent } = await owner.ok<{ sessionId: string }>("session.create");
    const published: unknown[] = [];
    const off = daemon.runtime.bus.subscribe(`session:${parent}`, (event) => {
      if ((event as { type?: string }).type === "result_delivered") published.push(event);
    });
    try {
      await owner.ok("session.send", {
        sessionId: parent,
        text: steps(
          {
            toolCalls: [
              {
                name: "Delegate",
                arguments: { task: steps({ text: "background answer" }), background: true },
              },
            ],
          },
          { text: "started it" },
        ),
      });
      // The parent's follow-up turn delivers the queued result; the delivery reaches the daemon's publisher.
      await waitFor(() => published.length > 0, "the delivery to be published");
      await daemon.runtime.service.whenIdle();
      const who = await owner.ok<{ accountId: string }>("daemon.whoami");
      const [resultId] = await daemon.runtime.repo.settledResultIds(parent, who.accountId);
      expect(published).toEqual([
        {
          type: "result_delivered",
          parentSessionId: parent,
          results: [expect.objectContaining({ resultId, kind: "subagent" })],
        },
      ]);
    } finally {
      off();
    }
  });

  it("the daemon's steer-settled sink: steering a runner child consumed at its tool round is published and counted (S004-507)", async () => {
    const hold = gate();
    holds.set("STEER-GRAND", hold);
    const { sessionId: parent } = await owner.ok<{ sessionId: string }>("session.create");
    const receipt = await owner.ok<{ childSessionId: string }>("session.delegate", {
      sessionId: parent,
      task: "STEER-CHILD work",
      model: MODEL,
      background: true,
    });
    const child = receipt.childSessionId;
    await waitFor(
      () => provider.requests.some((r) => lastUserText(r).includes("STEER-GRAND")),
      "the grandchild's request",
    );
    const settled: unknown[] = [];
    const off = daemon.runtime.bus.subscribe(`session:${child}`, (e) => {
      if ((e as { type?: string }).type === "steer_settled") settled.push(e);
    });
    const before = daemon.runtime.health().steering.settled;
    try {
      const who = await owner.ok<{ accountId: string }>("daemon.whoami");
      const steered = await daemon.runtime.service.continueSubagent({
        parentSessionId: parent,
        principalAccountId: who.accountId,
        childSessionId: child,
        toolCallId: `steer-${randomUUID()}`,
        text: "also look at the STEER-NOTE",
        mode: "background",
      });
      expect(steered.kind).toBe("steered");
      hold.open();
      await waitFor(() => settled.length > 0, "the steer to settle");
      expect(settled).toEqual([
        { type: "steer_settled", runnerId: expect.stringMatching(/^runner-/), sessionId: child, count: 1 },
      ]);
      expect(daemon.runtime.health().steering.settled).toBe(before + 1);
      // The child's next model request carries the steering text.
      await waitFor(
        () => provider.requests.some((r) => JSON.stringify(r.body.messages).includes("STEER-NOTE")),
        "the steered request",
      );
    } finally {
      off();
    }
  });

  it("the daemon's process-changed sink counts its runners' starts and exits in /health (S004-507)", async () => {
    type Health = { processes: { started: number; exited: number } };
    const counts = async () =>
      ((await ownerHealth(daemon.state.url, daemon.config.dataDir)) as Health).processes;
    const changes: string[] = [];
    const off = daemon.runtime.bus.subscribe("daemon:processes", (e) => {
      changes.push((e as { state: string }).state);
    });
    try {
      const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
      const delegate = (text: string) => owner.ok("session.delegate", { sessionId, task: steps({ text }) });
      // A runner is up (this turn starts one if none is), and nothing runs when it is killed.
      await delegate("before the kill");
      await daemon.runtime.service.whenIdle();
      const before = await counts();
      expect(await killRunnersOf(process.pid)).toBeGreaterThanOrEqual(1);
      await waitFor(async () => (await counts()).exited > before.exited, "the exit to be counted");
      // The next turn needs a runner again: the one the pool starts is counted.
      await delegate("after the kill");
      await waitFor(async () => (await counts()).started > before.started, "the start to be counted");
      expect(changes).toContain("exited");
      expect(changes.indexOf("started", changes.indexOf("exited"))).toBeGreaterThan(-1);
    } finally {
      off();
    }
  });

  it("the daemon's runner-exit-tokens sink: a SIGKILLed runner's contained processes are ended (S004-507)", async () => {
    const sessionId = `spawner-${randomUUID()}`;
    const result = await daemon.runtime.runnerPool.runTurn({
      turnId: `t-${randomUUID()}`,
      channelId: "containment",
      sessionId,
      prompt: "start a long process",
      script: [{ kind: "spawn", command: ["sleep", "300"] }],
    });
    expect(result.stopReason).toBe("end");
    const view = await daemon.runtime.runnerPool.tap(sessionId, () => {});
    const pid = Number(view?.snapshot.history.find((h) => h.role === "tool" && /^\d+$/.test(h.text))?.text);
    await view?.close();
    expect(pid).toBeGreaterThan(0);
    const alive = () => {
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    };
    try {
      // The runner's heartbeat (every HEARTBEAT_INTERVAL_MS) carries the kill token to the daemon first.
      await new Promise((r) => setTimeout(r, 6_500));
      expect(alive()).toBe(true);
      const exitedBefore = daemon.runtime.health().processes.exited;
      expect(await killRunnersOf(process.pid)).toBeGreaterThanOrEqual(1);
      await waitFor(() => daemon.runtime.health().processes.exited > exitedBefore, "the runner exit");
      await waitFor(() => !alive(), "the contained process to end");
    } finally {
      if (alive()) process.kill(pid, "SIGKILL");
    }
  }, 60_000);
});

/** SIGKILL the runner processes forked by `parent` (found in the process table). */
async function killRunnersOf(parent: number): Promise<number> {
  let killed = 0;
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = await readFile(`/proc/${entry}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const cmd = await readFile(`/proc/${entry}/cmdline`, "utf8");
      if (ppid === parent && cmd.includes("runner.js")) {
        process.kill(Number(entry), "SIGKILL");
        killed++;
      }
    } catch {}
  }
  return killed;
}
