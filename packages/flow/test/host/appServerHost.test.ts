import { rmSync } from "node:fs";
import { FakeAppServer } from "@crw/tools/codex";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  answerText,
  createAppServerHost,
  type HostThread,
  type HostTurn,
  type SessionHost,
} from "../../src/index.js";

let fake: FakeAppServer;
let host: ReturnType<typeof createAppServerHost>;

beforeEach(async () => {
  fake = await FakeAppServer.start();
  host = createAppServerHost({ transport: fake.url, requestTimeoutMs: 2_000, connectTimeoutMs: 2_000 });
});

afterEach(async () => {
  await host.close();
  await fake.stop();
});

function ok<T>(result: { ok: true; value: T } | { ok: false; reason: string; message: string }): T {
  if (!result.ok) throw new Error(`expected ok, got ${result.reason}: ${result.message}`);
  return result.value;
}

const marker =
  "crw-flow-op: c1/t1-a1\nCRW-ROLE: reviewer\n\nYour shell starts in a directory that is NOT your workspace.";

describe("app-server host over ws against the fake host", () => {
  it("reads a spawned subagent: parent, role, pair, host cwd, status, rollout and the marker turn", async () => {
    const owner = fake.createOwnerThread({ cwd: "/work/owner" });
    const ownerTurn = fake.startOwnerTurn(owner);
    const child = fake.spawnSubagent({
      ownerThreadId: owner,
      message: marker,
      model: "mock-reviewer",
      reasoningEffort: "high",
      agentRole: "explorer",
    });
    const thread = ok(await host.readThread(child.threadId));
    expect(thread).toMatchObject({
      id: child.threadId,
      parentThreadId: owner,
      agentRole: "explorer",
      model: "mock-reviewer",
      reasoningEffort: "high",
      cwd: "/work/owner",
      status: { type: "active", activeFlags: [] },
    });
    expect(thread.rolloutPath).toMatch(/rollout-.*\.jsonl$/);
    expect(thread.turns).toHaveLength(1);
    expect(thread.turns[0]).toMatchObject({ id: child.turnId, status: "inProgress", error: null });
    expect(thread.turns[0]?.items[0]).toMatchObject({ type: "userMessage", text: marker });

    const ownerThread = ok(await host.readThread(owner));
    expect(ownerThread.parentThreadId).toBeNull();
    const spawn = ownerThread.turns
      .find((t) => t.id === ownerTurn)
      ?.items.find((i) => i.type === "collabAgentToolCall");
    expect(spawn).toMatchObject({
      tool: "spawnAgent",
      senderThreadId: owner,
      receiverThreadIds: [child.threadId],
      prompt: marker,
      model: "mock-reviewer",
      reasoningEffort: "high",
    });
  });

  it("partial_answer is a phase of its own: not the answer, and no commentary before a phase-less answer", async () => {
    const owner = fake.createOwnerThread();
    const child = fake.spawnSubagent({ ownerThreadId: owner, message: marker });
    fake.completeTurn(child.threadId, {
      messages: [
        // the fake's types name the two phases it scripts; the wire carries the protocol's third one
        { text: '{"part":1}', phase: "partial_answer" },
        { text: '{"whole":true}', phase: null },
      ],
    });
    const turn = ok(await host.readThread(child.threadId)).turns[0] as HostTurn;
    expect(turn.items.slice(1).map((i) => (i.type === "agentMessage" ? i.phase : i.type))).toEqual([
      "partial_answer",
      null,
    ]);
    expect(answerText(turn)).toBe('{"whole":true}');
    const only = fake.spawnSubagent({ ownerThreadId: owner, message: marker });
    fake.completeTurn(only.threadId, {
      messages: [{ text: '{"part":1}', phase: "partial_answer" }],
    });
    expect(answerText(ok(await host.readThread(only.threadId)).turns[0] as HostTurn)).toBeNull();
  });

  it("maps agent messages with their phases and a completed turn", async () => {
    const owner = fake.createOwnerThread();
    const child = fake.spawnSubagent({ ownerThreadId: owner, message: marker });
    fake.completeTurn(child.threadId, {
      messages: [
        { text: "looking around", phase: "commentary" },
        { text: '{"ok":true}', phase: "final_answer" },
        { text: "no phase", phase: null },
      ],
    });
    const thread = ok(await host.readThread(child.threadId));
    expect(thread.status).toEqual({ type: "idle" });
    const turn = thread.turns[0];
    expect(turn?.status).toBe("completed");
    expect(turn?.items.slice(1).map((i) => (i.type === "agentMessage" ? [i.text, i.phase] : i.type))).toEqual(
      [
        ["looking around", "commentary"],
        ['{"ok":true}', "final_answer"],
        ["no phase", null],
      ],
    );
  });

  it("reads the cumulative token count from the rollout's last token_count, in all its parts", async () => {
    const owner = fake.createOwnerThread();
    const child = fake.spawnSubagent({ ownerThreadId: owner, message: marker });
    let thread = ok(await host.readThread(child.threadId));
    expect(ok(await host.readTokenCount(thread))).toBeUndefined();
    fake.answer(child.threadId, "{}", { input: 100, cached_input: 40, output: 10, reasoning_output: 4 });
    fake.sendInput(child.threadId, "crw-flow-op: c1/t2-a1\nrepair it");
    fake.answer(child.threadId, "{}", {
      input: 50,
      cached_input: 0,
      output: 5,
      reasoning_output: 1,
      total: 56,
    });
    thread = ok(await host.readThread(child.threadId));
    expect(ok(await host.readTokenCount(thread))).toEqual({
      input: 150,
      cached_input: 40,
      output: 15,
      reasoning_output: 5,
      total: 166,
    });
  });

  it("a rollout that cannot be read is a clear failure, not a count", async () => {
    const owner = fake.createOwnerThread();
    const child = fake.spawnSubagent({ ownerThreadId: owner, message: marker });
    const thread = ok(await host.readThread(child.threadId));
    rmSync(thread.rolloutPath as string);
    const count = await host.readTokenCount(thread);
    // a reason of its own: no protocol failure (the host answered as it should)
    expect(count).toMatchObject({ ok: false, reason: "rollout_unreadable" });
    expect(count.ok ? "" : count.message).toMatch(/rollout .* cannot be read/);
    const noPath: HostThread = { ...thread, rolloutPath: null };
    expect(await host.readTokenCount(noPath)).toMatchObject({ ok: false, reason: "rollout_unreadable" });
  });

  it("lists the owner's subagents only, with their turns", async () => {
    const owner = fake.createOwnerThread();
    const other = fake.createOwnerThread();
    const a = fake.spawnSubagent({ ownerThreadId: owner, message: "crw-flow-op: a/t1-a1" });
    const b = fake.spawnSubagent({ ownerThreadId: owner, message: "crw-flow-op: b/t1-a1" });
    fake.spawnSubagent({ ownerThreadId: other, message: "crw-flow-op: x/t1-a1" });
    const listed = ok(await host.listSubagents(owner));
    expect(listed.map((t) => t.id).sort()).toEqual([a.threadId, b.threadId].sort());
    expect(listed.every((t) => t.turns.length === 1 && t.parentThreadId === owner)).toBe(true);
    const list = fake.requests.find((r) => r.method === "thread/list");
    expect(list?.params).toMatchObject({ sourceKinds: ["subAgentThreadSpawn"], parentThreadId: owner });
  });

  it("lists every subagent across thread/list pages", async () => {
    const owner = fake.createOwnerThread();
    const ids = new Set<string>();
    for (let i = 0; i < 130; i++)
      ids.add(fake.spawnSubagent({ ownerThreadId: owner, message: `crw-flow-op: c${i}/t1-a1` }).threadId);
    const listed = ok(await host.listSubagents(owner));
    expect(new Set(listed.map((t) => t.id))).toEqual(ids);
    expect(fake.requests.filter((r) => r.method === "thread/list").length).toBe(2);
  });

  it.each([
    "usageLimitExceeded",
    "rateLimitExceeded",
    "contextWindowExceeded",
    "internalServerError",
    "other",
  ])("a failed turn carries its codexErrorInfo kind (%s) and the thread reads systemError", async (kind) => {
    const owner = fake.createOwnerThread();
    const child = fake.spawnSubagent({ ownerThreadId: owner, message: marker });
    fake.failTurn(child.threadId, kind, { message: `boom: ${kind}` });
    const thread = ok(await host.readThread(child.threadId));
    expect(thread.status).toEqual({ type: "systemError" });
    expect(thread.turns[0]).toMatchObject({
      status: "failed",
      error: { message: `boom: ${kind}`, codexErrorInfo: kind },
    });
  });

  it("interrupts a running turn; an unknown thread is unknown_thread, not unreachable", async () => {
    const owner = fake.createOwnerThread();
    const child = fake.spawnSubagent({ ownerThreadId: owner, message: marker });
    ok(await host.interruptTurn(child.threadId, child.turnId));
    const thread = ok(await host.readThread(child.threadId));
    expect(thread.turns[0]?.status).toBe("interrupted");
    expect(thread.status).toEqual({ type: "idle" });
    const missing = "019a0000-0000-7000-8000-000000000000";
    expect(await host.readThread(missing)).toMatchObject({ ok: false, reason: "unknown_thread" });
    expect(await host.interruptTurn(missing, "t")).toMatchObject({ ok: false, reason: "unknown_thread" });
  });

  it("interrupting a turn that runs nothing is ok: a turn that ended, a thread the host has not loaded", async () => {
    const owner = fake.createOwnerThread();
    const child = fake.spawnSubagent({ ownerThreadId: owner, message: marker });
    fake.answer(child.threadId, "{}");
    ok(await host.interruptTurn(child.threadId, child.turnId));
    expect(ok(await host.readThread(child.threadId)).turns[0]?.status).toBe("completed");
    fake.closeAgent(child.threadId);
    ok(await host.interruptTurn(child.threadId, child.turnId));
  });

  it("thread statuses read as the host sets them", async () => {
    const owner = fake.createOwnerThread();
    for (const status of ["notLoaded", "systemError", "idle"] as const) {
      fake.setThreadStatus(owner, status);
      expect(ok(await host.readThread(owner)).status).toEqual({ type: status });
    }
  });

  it("starts a turn on an idle owner, and resumes a notLoaded one first", async () => {
    const owner = fake.createOwnerThread();
    const first = ok(await host.startTurn(owner, "session_step_waiting: 1 step"));
    fake.completeTurn(owner);
    fake.setThreadStatus(owner, "notLoaded");
    const second = ok(await host.startTurn(owner, "session_step_waiting: again"));
    const thread = ok(await host.readThread(owner));
    expect(thread.turns.map((t) => t.id)).toEqual([first.turnId, second.turnId]);
    expect(thread.turns[1]?.items[0]).toMatchObject({
      type: "userMessage",
      text: "session_step_waiting: again",
    });
    const methods = fake.requests.map((r) => r.method);
    expect(methods.lastIndexOf("thread/resume")).toBeLessThan(methods.lastIndexOf("turn/start"));
    expect(methods.filter((m) => m === "thread/resume")).toHaveLength(1);
  });

  it("an answer that is not the protocol is a protocol failure", async () => {
    const owner = fake.createOwnerThread();
    fake.overrideAnswer("thread/read", { thread: { id: owner, status: { type: "weird" } } });
    const read = await host.readThread(owner);
    expect(read).toMatchObject({ ok: false, reason: "protocol" });
  });

  it("reports a configWarning notification as a typed event", async () => {
    const events: string[] = [];
    const watched = createAppServerHost({
      transport: fake.url,
      onEvent: (e) => {
        if (e.type === "config_warning") events.push(e.summary);
      },
    });
    const owner = fake.createOwnerThread();
    ok(await watched.readThread(owner));
    fake.notify("configWarning", { summary: "Invalid configuration; using defaults", details: null });
    await expect.poll(() => events).toEqual(["Invalid configuration; using defaults"]);
    await watched.close();
  });
});

describe("a host that cannot be reached answers data, never hangs", () => {
  it("unreachable while the server is down, and reconnects when it is back", async () => {
    const owner = fake.createOwnerThread();
    ok(await host.readThread(owner));
    await fake.setUnreachable();
    expect(await host.readThread(owner)).toMatchObject({ ok: false, reason: "unreachable" });
    expect(await host.listSubagents(owner)).toMatchObject({ ok: false, reason: "unreachable" });
    expect(await host.startTurn(owner, "x")).toMatchObject({ ok: false, reason: "unreachable" });
    await fake.setReachable();
    expect(ok(await host.readThread(owner)).id).toBe(owner);
  });

  it("a request never answered is unreachable within the request bound", async () => {
    const owner = fake.createOwnerThread();
    const quick = createAppServerHost({ transport: fake.url, requestTimeoutMs: 300 });
    ok(await quick.readThread(owner));
    fake.setUnresponsive(["thread/read"]);
    const read = await quick.readThread(owner);
    expect(read).toMatchObject({ ok: false, reason: "unreachable" });
    expect(read.ok ? "" : read.message).toMatch(/thread\/read: no answer within 300 ms/);
    fake.setUnresponsive([]);
    expect(ok(await quick.readThread(owner)).id).toBe(owner);
    await quick.close();
  });

  it("a transport that dies rejects every pending request at once", async () => {
    const owner = fake.createOwnerThread();
    const slow = createAppServerHost({ transport: fake.url, requestTimeoutMs: 60_000 });
    ok(await slow.readThread(owner));
    fake.setUnresponsive("*");
    const pending = [slow.readThread(owner), slow.listSubagents(owner), slow.interruptTurn(owner, "t")];
    await expect.poll(() => fake.requests.length).toBeGreaterThanOrEqual(4);
    await fake.setUnreachable();
    const answers = await Promise.all(pending);
    for (const answer of answers) expect(answer).toMatchObject({ ok: false, reason: "unreachable" });
    await slow.close();
  });

  it("a server that accepts and never answers initialize is unreachable within the connect bound", async () => {
    fake.setUnresponsive(["initialize"]);
    const quick = createAppServerHost({ transport: fake.url, connectTimeoutMs: 300 });
    expect(await quick.readThread("x")).toMatchObject({ ok: false, reason: "unreachable" });
    await quick.close();
  });

  it("nothing listening on the port is unreachable", async () => {
    await fake.setUnreachable();
    const nobody = createAppServerHost({ transport: fake.url });
    expect(await nobody.readThread("x")).toMatchObject({ ok: false, reason: "unreachable" });
    await nobody.close();
    await fake.setReachable();
  });

  it("a closed adapter answers unreachable", async () => {
    const closing = createAppServerHost({ transport: fake.url });
    await closing.close();
    expect(await closing.readThread("x")).toMatchObject({ ok: false, reason: "unreachable" });
  });
});

describe("the stdio transport (a command speaking the protocol, like codex app-server proxy)", () => {
  let stdioHost: SessionHost;
  afterEach(async () => stdioHost?.close());

  it("reads threads through the command's stdin/stdout", async () => {
    stdioHost = createAppServerHost({ transport: fake.stdioProxyCommand(), requestTimeoutMs: 5_000 });
    const owner = fake.createOwnerThread();
    const child = fake.spawnSubagent({
      ownerThreadId: owner,
      message: marker,
      model: "m",
      reasoningEffort: "low",
    });
    const thread = ok(await stdioHost.readThread(child.threadId));
    expect(thread).toMatchObject({ parentThreadId: owner, model: "m", reasoningEffort: "low" });
    expect(ok(await stdioHost.listSubagents(owner)).map((t) => t.id)).toEqual([child.threadId]);
  });

  it("a command that exits rejects pending requests at once; the next call starts it again", async () => {
    stdioHost = createAppServerHost({ transport: fake.stdioProxyCommand(), requestTimeoutMs: 60_000 });
    const owner = fake.createOwnerThread();
    ok(await stdioHost.readThread(owner));
    fake.setUnresponsive(["thread/read"]);
    const pending = stdioHost.readThread(owner);
    await expect.poll(() => fake.requests.filter((r) => r.method === "thread/read").length).toBe(2);
    await fake.setUnreachable(); // the proxy's socket closes, so the proxy exits
    expect(await pending).toMatchObject({ ok: false, reason: "unreachable" });
    fake.setUnresponsive([]);
    await fake.setReachable();
    expect(ok(await stdioHost.readThread(owner)).id).toBe(owner);
  });

  it("a command that cannot run is unreachable", async () => {
    stdioHost = createAppServerHost({ transport: "/nonexistent/codex app-server proxy" });
    const read = await stdioHost.readThread("x");
    expect(read).toMatchObject({ ok: false, reason: "unreachable" });
  });
});
