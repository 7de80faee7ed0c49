import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  functionOutputs,
  MockModel,
  type ModelReply,
  type ModelRequest,
  type RealCodex,
  startRealCodex,
  toolNamespace,
  userTexts,
} from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createAppServerHost,
  type HostThread,
  hostTransportFromSpec,
  type SessionHost,
} from "../../src/index.js";

/**
 * The adapter against the real `codex app-server` of the pinned package, offline: a mock Responses model
 * plays the owner (a shell command, spawn_agent, wait_agent) and the subagent (commentary, then a JSON
 * final answer with usage). The server listens on its control socket; the adapter reaches it the default
 * way (an empty host spec): `codex app-server proxy` with CODEX_HOME.
 */

const marker =
  "crw-flow-op: review/t1-a1\nCRW-ROLE: reviewer\n\nYour shell starts in a directory that is NOT your workspace.";
const subUsage = { input: 300, cached_input: 100, output: 30, reasoning_output: 7 };

let model: MockModel;
let codex: RealCodex;
let home: string;
let host: SessionHost;
let ownerThreadId: string;
let shellOutput = "";
/** Released by a test to let a held subagent answer. */
let releaseHeld: (() => void) | null = null;

function ok<T>(result: { ok: true; value: T } | { ok: false; reason: string; message: string }): T {
  if (!result.ok) throw new Error(`expected ok, got ${result.reason}: ${result.message}`);
  return result.value;
}

/** Model failures and the codexErrorInfo kind the pinned codex reports for each (observed). */
const failures: Record<string, ModelReply> = {
  http500: { items: [], status: 500 },
  http429: { items: [], status: 429 },
  usageLimit: {
    items: [],
    status: 429,
    error: { type: "usage_limit_reached", plan_type: "plus", resets_in_seconds: 60 },
  },
  contextWindow: { items: [], failed: { code: "context_length_exceeded", message: "too long" } },
  rateLimit: {
    items: [],
    failed: { code: "rate_limit_exceeded", message: "Rate limit reached. Try again in 1s." },
  },
};
const failureKinds: Record<string, string> = {
  http500: "internalServerError",
  http429: "responseTooManyFailedAttempts",
  usageLimit: "usageLimitExceeded",
  contextWindow: "contextWindowExceeded",
  rateLimit: "rateLimitExceeded",
};

const lastUserText = (request: ModelRequest) => userTexts(request).at(-1) ?? "";

function ownerStep(request: ModelRequest) {
  const outputs = functionOutputs(request);
  if (lastUserText(request).includes("session_step_waiting")) {
    return { items: [{ type: "message" as const, text: "woken", phase: "final_answer" as const }] };
  }
  if (outputs.length === 0) {
    return {
      items: [
        {
          type: "function_call" as const,
          name: "exec_command",
          arguments: { cmd: "echo owner=$CODEX_THREAD_ID home=$CODEX_HOME" },
        },
      ],
    };
  }
  if (outputs.length === 1) {
    shellOutput = outputs[0]?.output ?? "";
    return {
      items: [
        {
          type: "function_call" as const,
          name: "spawn_agent",
          namespace: toolNamespace(request, "spawn_agent"),
          arguments: { message: marker, model: "mock-reviewer", reasoning_effort: "high" },
        },
      ],
    };
  }
  if (outputs.length === 2) {
    const spawned = JSON.parse(outputs[1]?.output ?? "{}") as { agent_id?: string };
    return {
      items: [
        {
          type: "function_call" as const,
          name: "wait_agent",
          namespace: toolNamespace(request, "wait_agent"),
          arguments: { targets: [spawned.agent_id], timeout_ms: 30_000 },
        },
      ],
    };
  }
  return { items: [{ type: "message" as const, text: "all done", phase: "final_answer" as const }] };
}

beforeAll(async () => {
  model = await MockModel.start();
  model.on(
    (r) => r.parentThreadId !== null && lastUserText(r).includes("hold-this-turn"),
    () =>
      new Promise((resolve) => {
        releaseHeld = () => resolve({ items: [{ type: "message", text: "{}", phase: "final_answer" }] });
      }),
  );
  for (const [name, reply] of Object.entries(failures)) {
    model.on(
      (r) => lastUserText(r).includes(`fail-this-turn-${name}`),
      () => reply,
    );
  }
  model.on(
    (r) => r.parentThreadId !== null,
    () => ({
      items: [
        { type: "message", text: "Reading the packet.", phase: "commentary" },
        { type: "message", text: 'Here it is: {"verdict":"ok","score":42}', phase: "final_answer" },
      ],
      usage: subUsage,
    }),
  );
  model.otherwise(ownerStep);
  home = mkdtempSync(join(tmpdir(), "crw-real-codex-"));
  codex = await startRealCodex({
    home,
    cwd: home,
    baseUrl: model.baseUrl,
    models: ["mock-reviewer"],
    listen: "unix",
  });
  // crw's default host: `codex app-server proxy` (codex found as a user's install would find it) with CODEX_HOME.
  const transport = hostTransportFromSpec("", { ...process.env, CODEX_HOME: home });
  host = createAppServerHost({ transport, requestTimeoutMs: 15_000 });
  const started = await codex.client.request<{ thread: { id: string } }>("thread/start", { cwd: home });
  ownerThreadId = started.thread.id;
  const turn = await codex.client.request<{ turn: { id: string } }>("turn/start", {
    threadId: ownerThreadId,
    input: [{ type: "text", text: "run the workflow", text_elements: [] }],
  });
  await codex.client.waitTurnCompleted(ownerThreadId, turn.turn.id, 60_000);
}, 120_000);

afterAll(async () => {
  await host?.close();
  await codex?.stop();
  await model?.stop();
  if (home) rmSync(home, { recursive: true, force: true });
});

describe("the adapter against the real codex app-server", () => {
  let child: HostThread;

  it("the owner ran a shell command with CODEX_THREAD_ID and spawned a subagent the adapter lists", async () => {
    expect(shellOutput).toContain(`owner=${ownerThreadId}`);
    expect(shellOutput).toContain(`home=${home}`);
    const listed = ok(await host.listSubagents(ownerThreadId));
    expect(listed).toHaveLength(1);
    child = listed[0] as HostThread;
    expect(child.parentThreadId).toBe(ownerThreadId);
  });

  it("reads the subagent: marker in its first user message, model, effort, final_answer, host cwd", async () => {
    const thread = ok(await host.readThread(child.id));
    expect(thread).toMatchObject({
      parentThreadId: ownerThreadId,
      model: "mock-reviewer",
      reasoningEffort: "high",
      cwd: home,
      status: { type: "idle" },
    });
    const turn = thread.turns[0];
    expect(turn?.status).toBe("completed");
    expect(turn?.items[0]).toMatchObject({ type: "userMessage", text: marker });
    const messages = turn?.items.filter((i) => i.type === "agentMessage");
    expect(messages).toMatchObject([
      { text: "Reading the packet.", phase: "commentary" },
      { text: 'Here it is: {"verdict":"ok","score":42}', phase: "final_answer" },
    ]);
    const owner = ok(await host.readThread(ownerThreadId));
    const spawn = owner.turns.flatMap((t) => t.items).find((i) => i.type === "collabAgentToolCall");
    expect(spawn).toMatchObject({
      tool: "spawnAgent",
      senderThreadId: ownerThreadId,
      receiverThreadIds: [child.id],
      prompt: marker,
      model: "mock-reviewer",
      reasoningEffort: "high",
    });
  });

  it("reads the subagent's tokens from its rollout, in all their parts", async () => {
    const thread = ok(await host.readThread(child.id));
    expect(thread.rolloutPath).toMatch(/rollout-.*\.jsonl$/);
    expect(ok(await host.readTokenCount(thread))).toEqual({
      input: 300,
      cached_input: 100,
      output: 30,
      reasoning_output: 7,
      total: 330,
    });
  });

  it("interrupts a subagent turn that does not end, and the thread reads not active after", async () => {
    const start = codex.client.notifications.length;
    const turnId = ok(await host.startTurn(child.id, "crw-flow-op: review/t2-a1\nhold-this-turn"));
    await codex.client.waitFor(
      (n) => n.method === "turn/started" && n.params.threadId === child.id,
      30_000,
      start,
    );
    const running = ok(await host.readThread(child.id));
    expect(running.turns.find((t) => t.id === turnId.turnId)?.status).toBe("inProgress");
    ok(await host.interruptTurn(child.id, turnId.turnId));
    await codex.client.waitTurnCompleted(child.id, turnId.turnId, 30_000);
    releaseHeld?.();
    const after = ok(await host.readThread(child.id));
    expect(after.status.type).not.toBe("active");
    expect(after.turns.find((t) => t.id === turnId.turnId)?.status).toBe("interrupted");
  });

  it("a thread started and never given a turn reads with no turns", async () => {
    const fresh = await codex.client.request<{ thread: { id: string } }>("thread/start", { cwd: home });
    const thread = ok(await host.readThread(fresh.thread.id));
    expect(thread).toMatchObject({
      id: fresh.thread.id,
      parentThreadId: null,
      turns: [],
      status: { type: "idle" },
    });
  });

  it("an unknown thread is unknown_thread", async () => {
    expect(await host.readThread("019a0000-0000-7000-8000-000000000000")).toMatchObject({
      ok: false,
      reason: "unknown_thread",
    });
  });

  it("wakes the idle owner with a new turn", async () => {
    const { turnId } = ok(await host.startTurn(ownerThreadId, "session_step_waiting: 1 step waits"));
    await codex.client.waitTurnCompleted(ownerThreadId, turnId, 30_000);
    const owner = ok(await host.readThread(ownerThreadId));
    const woken = owner.turns.find((t) => t.id === turnId);
    expect(woken?.items[0]).toMatchObject({
      type: "userMessage",
      text: "session_step_waiting: 1 step waits",
    });
    expect(woken?.items.at(-1)).toMatchObject({ type: "agentMessage", text: "woken", phase: "final_answer" });
  });

  it.each(Object.keys(failures))(
    "a model failure (%s) fails the turn with a codexErrorInfo kind",
    async (name) => {
      const { turnId } = ok(
        await host.startTurn(child.id, `crw-flow-op: review/t3-a1\nfail-this-turn-${name}`),
      );
      await codex.client.waitTurnCompleted(child.id, turnId, 20_000);
      const thread = ok(await host.readThread(child.id));
      const turn = thread.turns.find((t) => t.id === turnId);
      expect(turn?.status).toBe("failed");
      expect(turn?.error?.codexErrorInfo).toBe(failureKinds[name]);
      expect(thread.status).toEqual({ type: "systemError" });
    },
  );

  it("after an app-server restart threads read notLoaded, and a wake resumes the owner first", async () => {
    await codex.stop();
    codex = await startRealCodex({
      home,
      cwd: home,
      baseUrl: model.baseUrl,
      models: ["mock-reviewer"],
      listen: "unix",
    });
    // The adapter's connection died with the old server: the read goes out again on a new one.
    const thread = ok(await host.readThread(child.id));
    expect(thread.status).toEqual({ type: "notLoaded" });
    // turn/interrupt answers "thread not found" for a thread the server has not loaded: it runs nothing.
    ok(await host.interruptTurn(child.id, thread.turns[0]?.id as string));
    expect(thread.turns[0]?.items[0]).toMatchObject({ type: "userMessage", text: marker });
    expect(ok(await host.listSubagents(ownerThreadId)).map((t) => t.id)).toEqual([child.id]);
    const { turnId } = ok(await host.startTurn(ownerThreadId, "session_step_waiting: after restart"));
    // The test's new client never loaded the owner, so it gets no notifications of it: read instead.
    await expect
      .poll(async () => ok(await host.readThread(ownerThreadId)).turns.find((t) => t.id === turnId)?.status, {
        timeout: 20_000,
        interval: 200,
      })
      .toBe("completed");
    expect(ok(await host.readThread(ownerThreadId)).status).toEqual({ type: "idle" });
  });
});
