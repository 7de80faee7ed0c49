import { mkdirSync, mkdtempSync, realpathSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { PgDelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import {
  canonicalJson,
  captureDelegatedExecutionScope,
  createScriptedTurnRunner,
  recoverDelegations,
} from "../../src/index.js";
import {
  answeredChild,
  type Caller,
  continueForeground,
  delegateCall,
  delegateForeground,
  gatedHelperTask,
  gateTool,
  interruptedContinuation,
  latch,
  makeService,
  messages,
  newParent,
  probeTool,
  recording,
  scratchDir,
  scriptTask,
  serviceWithGate,
  waitFor,
  writeTask,
  writeTool,
} from "./helpers.js";

const db = useTestDatabase();

/** The results of the Write calls in `childId`'s journal, in order. */
const writeResults = async (repo: PgDelegationRepository, childId: string, accountId: string) =>
  messages(await repo.readJournal(childId, accountId)).filter(
    (m) => m.role === "toolResult" && m.toolName === "Write",
  );

/** A child of `caller`'s parent holding `scope` as a host placed it, ready to delegate in its turn. */
async function childWithScope(
  repo: PgDelegationRepository,
  caller: Caller,
  toolCallId: string,
  scope: Record<string, unknown>,
) {
  const made = await repo.createDelegation({
    parentSessionId: caller.parent.id,
    principalAccountId: caller.account.id,
    toolCallId,
    task: "t",
    mode: "background",
    model: "scripted",
    scope: JSON.stringify({ accountId: caller.account.id, ...scope }),
  });
  return made.child;
}

/** A background delegation from session `from`, placed at `cwd` (the caller's own directory when null). */
const placeFrom = (
  service: ReturnType<typeof makeService>["service"],
  from: string,
  caller: Caller,
  toolCallId: string,
  cwd: string | null,
) =>
  service.delegate({
    parentSessionId: from,
    principalAccountId: caller.account.id,
    toolCallId,
    task: "t",
    mode: "background",
    ...(cwd === null ? {} : { workDir: cwd }),
  });

const storedScope = async (childId: string) =>
  JSON.parse(
    (await db.pool.query<{ scope: string }>("select scope from sessions where id = $1", [childId])).rows[0]
      ?.scope ?? "null",
  );

/**
 * A service whose child's first turn gets the caller's text "one more thing" while it works, then ends as
 * `ending` says (null: as the script would).
 */
function steeredService(ending: { stopReason: "error"; errorMessage: string } | null) {
  let steered = false;
  const base = createScriptedTurnRunner();
  const made = makeService(db.pool, {
    runner: {
      async runTurn(request, host) {
        if (!request.scope || steered) return base.runTurn(request, host);
        steered = true;
        await made.repo.enqueueSteer(request.sessionId, request.principalAccountId, "one more thing");
        return ending ?? base.runTurn(request, host);
      },
    },
  });
  return made;
}

describe("scope capture and live access in delegation", () => {
  it("the captured operator flag comes from the account: owners and administrators, nobody else (S004-200)", async () => {
    const { service } = makeService(db.pool);
    const flags: boolean[] = [];
    for (const account of [{ isAdministrator: true }, { isOwner: true }, {}]) {
      const { account: a, parent } = await newParent(service, account);
      const r = await service.delegate({
        parentSessionId: parent.id,
        principalAccountId: a.id,
        toolCallId: "d",
        task: "t",
        mode: "foreground",
      });
      if (r.kind !== "result") throw new Error("expected result");
      flags.push((await storedScope(r.childSessionId)).operator);
    }
    expect(flags).toEqual([true, true, false]);
  });

  it("a narrowed account grant clamps a later continuation, whose Write is refused, and leaves the stored scope as captured (S004-210 S004-318)", async () => {
    const { service, repo } = makeService(db.pool, { tools: () => [writeTool] });
    const { account, parent } = await newParent(service);
    const first = await delegateForeground(service, { parent, account }, "d", writeTask("wrote"));
    if (first.kind !== "result") throw new Error("expected result");
    const before = await storedScope(first.childSessionId);
    await db.pool.query("update accounts set tool_allow = '{Read}' where id = $1", [account.id]);
    await continueForeground(service, { parent, account }, first.childSessionId, "c", writeTask("tried"));
    const writes = await writeResults(repo, first.childSessionId, account.id);
    expect(writes.map((w) => (w.role === "toolResult" ? w.isError : null))).toEqual([false, true]);
    expect(await storedScope(first.childSessionId)).toEqual(before);
  });

  it("a widened account grant gives a continuation nothing its captured scope did not allow (S004-210)", async () => {
    const { seen, runner } = recording();
    const { service, repo } = makeService(db.pool, { runner, tools: () => [writeTool] });
    const { account, parent } = await newParent(service, { toolAllow: ["Read"] });
    const first = await delegateForeground(service, { parent, account }, "d", "t");
    if (first.kind !== "result") throw new Error("expected result");
    const before = await storedScope(first.childSessionId);
    expect(before.tools.allow).toEqual(["Read"]);
    await db.pool.query("update accounts set tool_allow = '{Read,Write}' where id = $1", [account.id]);
    await continueForeground(service, { parent, account }, first.childSessionId, "c", writeTask("tried"));
    const later = seen.filter((r) => r.sessionId === first.childSessionId).at(-1);
    expect(later?.scope?.tools.allow).toEqual(["Read"]);
    const writes = await writeResults(repo, first.childSessionId, account.id);
    expect(writes.map((w) => (w.role === "toolResult" ? w.isError : null))).toEqual([true]);
    expect(await storedScope(first.childSessionId)).toEqual(before);
  });

  it("every turn of a call reads the call's live-narrowed scope: its own, a helper's result with a follow-up, a recovered one (S004-220)", async () => {
    const { service, repo, seen, gate: helper } = serviceWithGate(db.pool, "h");
    const { account, parent } = await newParent(service);
    const caller = { parent, account };
    const child = await answeredChild(service, caller, "d", "x");
    // the grant narrows after the child's scope was captured: Write is no longer the account's
    await db.pool.query("update accounts set tool_allow = '{Read,Delegate,Gate}' where id = $1", [
      account.id,
    ]);
    const call = await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child,
      toolCallId: "c",
      text: gatedHelperTask("h", "h done", { answer: "C done", followUp: "C took" }),
      mode: "background",
    });
    if (call.kind !== "started") throw new Error("expected background");
    await waitFor(async () => {
      const last = messages(await repo.readJournal(child, account.id)).at(-1);
      return last?.role === "assistant" && JSON.stringify(last.content).includes("C done");
    }, "the call's own turn answered");
    // while the call settles (its helper still runs), a text follow-up is admitted into it
    expect((await continueForeground(service, caller, child, "s", "and also this")).kind).toBe("steered");
    helper.open();
    await waitFor(
      async () => (await repo.getRun(call.runId, account.id)).status === "succeeded",
      "the call settled",
    );
    await service.whenIdle();
    // a later call of the child interrupted by a crash: boot recovery runs it
    const run = await interruptedContinuation(service, caller, child, "r", "after restart");
    await recoverDelegations(service);
    await waitFor(async () => (await repo.getRun(run.id, account.id)).status === "succeeded", "recovery");
    await service.whenIdle();
    const turns = seen.filter((r) => r.sessionId === child);
    // each turn's newest inputs tell which it was: the call's own, its settlement's, the recovered one
    const newest = turns.map((t) =>
      t.context
        .slice(-2)
        .map((m) => (m.role === "custom" ? m.customType : m.role === "user" ? m.content : m.role)),
    );
    expect(newest).toHaveLength(4);
    expect(newest[1]?.at(-1)).toMatch(/"answer":"C done"/);
    expect(newest[2]).toEqual(["delegation_result", "and also this"]);
    expect(newest[3]).toEqual(["after restart", "interrupted"]);
    expect(turns[0]?.tools.map((t) => t.name)).toContain("Write");
    for (const turn of turns.slice(1)) {
      expect(turn.scope?.tools.allow).toEqual(["Delegate", "Gate", "Read"]);
      expect(turn.tools.map((t) => t.name)).not.toContain("Write");
    }
    await service.close();
  });

  it("continuation and boot recovery replay the stored working directory (S004-211 S004-266)", async () => {
    const { seen, runner } = recording();
    const { service, repo } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service, { isAdministrator: true });
    const dir = realpathSync(scratchDir("crw-cwd-"));
    const first = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "d",
      task: "t",
      mode: "foreground",
      workDir: dir,
    });
    if (first.kind !== "result") throw new Error("expected result");
    await continueForeground(service, { parent, account }, first.childSessionId, "c", "again");
    // a third call interrupted by a crash: recovery continues it in the same directory
    const run = await interruptedContinuation(
      service,
      { parent, account },
      first.childSessionId,
      "r",
      "after restart",
    );
    await recoverDelegations(service);
    await waitFor(
      async () => (await repo.getRun(run.id, account.id)).status === "succeeded",
      "recovered call",
    );
    await service.whenIdle();
    const childTurns = seen.filter((r) => r.sessionId === first.childSessionId);
    expect(childTurns).toHaveLength(3);
    expect(childTurns.map((r) => r.workDir)).toEqual([dir, dir, dir]);
    await service.close();
  });

  it("background delegation tells the model to keep working and offers no wait or sleep tool (S004-064 S004-065)", async () => {
    const { seen, runner } = recording();
    const { service, repo } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service);
    await service.prompt(
      parent.id,
      account.id,
      scriptTask({ rounds: [[delegateCall({ answer: "x" }, { background: true })]] }),
    );
    await service.whenIdle();
    const started = messages(await repo.readJournal(parent.id, account.id)).find(
      (m) => m.role === "toolResult",
    );
    expect(started?.role === "toolResult" && started.content).toMatch(/Keep doing independent work/);
    expect(started?.role === "toolResult" && started.content).toMatch(
      /End your turn when no independent work remains/,
    );
    const names = seen.flatMap((r) => r.tools.map((t) => t.name.toLowerCase()));
    expect(names.some((n) => n.includes("wait") || n.includes("sleep"))).toBe(false);
  });

  it("a text follow-up the call takes is delivered into the child's journal, and its receipt names the row it became (S004-044)", async () => {
    // the caller's text arrives while the child's first turn works; the turn then ends well
    const { service } = steeredService(null);
    const { account, parent } = await newParent(service);
    const r = await delegateForeground(service, { parent, account }, "d", "t");
    if (r.kind !== "result") throw new Error("expected a result");
    const receipts = await db.pool.query<{ status: string; journal_seq: string | null; drop_reason: null }>(
      "select status, journal_seq, drop_reason from delegated_steers where child_session_id = $1",
      [r.childSessionId],
    );
    expect(receipts.rows).toEqual([
      { status: "delivered", journal_seq: expect.anything(), drop_reason: null },
    ]);
    const row = await db.pool.query<{ body: string }>(
      "select body from journal_entries where session_id = $1 and seq = $2",
      [r.childSessionId, receipts.rows[0]?.journal_seq],
    );
    expect(row.rows[0]?.body).toContain("one more thing");
  });

  it("a text follow-up the call can no longer take gets its dropped notice; the failure persists only its reason (S004-044 S004-055 S004-057)", async () => {
    // a Build caller's text arrives while the provider request is in flight, which then fails
    const { service } = steeredService({ stopReason: "error", errorMessage: "provider down" });
    const { account, parent } = await newParent(service);
    const r = await delegateForeground(service, { parent, account }, "d", "t");
    expect(r).toMatchObject({ kind: "result", outcome: "error" });
    const receipts = await db.pool.query<{ status: string; drop_reason: string }>(
      "select status, drop_reason from delegated_steers where child_session_id = $1",
      [r.kind === "result" ? r.childSessionId : ""],
    );
    expect(receipts.rows).toEqual([{ status: "dropped", drop_reason: "the call ended: provider down" }]);
    // the failed turn's Error and cause stay in memory: the row keeps the code and reason, the result its text
    const run = await db.pool.query<{ error: unknown }>(
      "select error from subagent_runs where tool_call_id = 'd' and parent_session_id = $1",
      [parent.id],
    );
    expect(run.rows[0]?.error).toEqual({ code: "child_failed", message: "provider down" });
    const result = await db.pool.query<{ body: string }>(
      "select body from delegation_results where parent_session_id = $1",
      [parent.id],
    );
    expect(result.rows.map((r) => r.body)).toEqual(["provider down"]);
  });

  it("bad input to Delegate is refused with a typed error and nothing is written: a smuggled dream, a drive-relative cwd (S004-566)", async () => {
    const { service } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const before = (await db.pool.query("select count(*)::int as n from sessions")).rows[0]?.n;
    await service.prompt(
      parent.id,
      account.id,
      scriptTask({
        rounds: [
          [
            delegateCall({ answer: "x" }, { dream: { runId: "r", accountUserId: account.id } }),
            delegateCall({ answer: "x" }, { cwd: "C:relative" }),
            delegateCall({ answer: "x" }, { cwd: "/srv/../etc" }),
          ],
        ],
        answer: "done",
      }),
    );
    const results = messages(await service.repo.readJournal(parent.id, account.id)).filter(
      (m) => m.role === "toolResult",
    );
    expect(
      results.map((m) => (m.role === "toolResult" ? [m.isError, m.content.split(":")[0]] : null)),
    ).toEqual([
      [true, "invalid_input"],
      [true, "invalid_work_dir"],
      [true, "work_dir_not_permitted"],
    ]);
    expect((await db.pool.query("select count(*)::int as n from sessions")).rows[0]?.n).toBe(before);
    expect(
      (await db.pool.query("select 1 from subagent_runs where parent_session_id = $1", [parent.id])).rowCount,
    ).toBe(0);
  });

  it("a refused admission, synchronous or asynchronous, emits no progress and no completion (S004-218)", async () => {
    const completions: unknown[] = [];
    const { service } = makeService(db.pool, {
      completionEmitter: async (c) => {
        completions.push(c);
      },
    });
    const { account, parent } = await newParent(service, { isAdministrator: true });
    const heard: string[] = [];
    const refuse = (toolCallId: string, workDir: string) =>
      service.delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId,
        task: "t",
        mode: "background",
        workDir,
        progress: (e) => heard.push(e.type),
      });
    await expect(refuse("bad", "C:relative")).rejects.toMatchObject({ code: "invalid_work_dir" });
    // a directory that does not exist is refused by the asynchronous part of admission
    const gone = join(realpathSync(tmpdir()), `crw-gone-${Date.now()}`);
    await expect(refuse("gone", gone)).rejects.toMatchObject({ code: "work_dir_unavailable" });
    await service.whenIdle();
    expect(heard).toEqual([]);
    expect(completions).toEqual([]);
    const results = await db.pool.query("select 1 from delegation_results where parent_session_id = $1", [
      parent.id,
    ]);
    expect(results.rowCount).toBe(0);
  });

  it("a call's session event and its receipt come only after its admission committed, for a delegation and a continuation (S004-216)", async () => {
    const { service, repo } = makeService(db.pool);
    const order: string[] = [];
    const createDelegation = repo.createDelegation.bind(repo);
    repo.createDelegation = async (input) => {
      const made = await createDelegation(input);
      order.push(`admitted ${input.toolCallId}`);
      return made;
    };
    const createContinuation = repo.createContinuation.bind(repo);
    repo.createContinuation = async (input) => {
      const made = await createContinuation(input);
      order.push(`admitted ${input.toolCallId}`);
      return made;
    };
    const { account, parent } = await newParent(service);
    const sink = (id: string) => (e: { type: string }) => {
      if (e.type === "session") order.push(`session ${id}`);
    };
    const first = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "d",
      task: "t",
      mode: "background",
      progress: sink("d"),
    });
    order.push(`receipt ${first.kind}`);
    await service.whenIdle();
    const again = await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: first.childSessionId,
      toolCallId: "c",
      text: "again",
      mode: "background",
      progress: sink("c"),
    });
    order.push(`receipt ${again.kind}`);
    await service.whenIdle();
    expect(order).toEqual([
      "admitted d",
      "session d",
      "receipt started",
      "admitted c",
      "session c",
      "receipt started",
    ]);
  });

  it("a scoped caller places its children only inside its own project (S004-257)", async () => {
    const root = realpathSync(scratchDir("crw-scoped-"));
    const inside = join(root, "sub");
    mkdirSync(inside);
    const outside = realpathSync(scratchDir("crw-outside-"));
    const { service, repo } = makeService(db.pool, {
      projects: { rootOf: (ref) => (ref === "p1" ? { ref, root } : undefined) },
    });
    const caller = await newParent(service);
    // a child bound to project p1 (as a host placed it), itself delegating
    const scoped = await childWithScope(repo, caller, "scoped", {
      target: { kind: "host", ref: "p1" },
      projectRef: "p1",
      workDir: root,
    });
    await expect(placeFrom(service, scoped.id, caller, "out", outside)).rejects.toMatchObject({
      name: "DelegatedScopeError",
    });
    const ok = await placeFrom(service, scoped.id, caller, "in", inside);
    expect(ok.kind).toBe("started");
    expect(await storedScope(ok.childSessionId)).toMatchObject({
      workDir: inside,
      target: { kind: "host", ref: "p1" },
    });
    expect(
      (await db.pool.query("select 1 from subagent_runs where parent_session_id = $1", [scoped.id])).rowCount,
    ).toBe(1);
    await service.whenIdle();
  });

  it("a managed caller's children stay under its own root, narrower than the guest's mount, and inherit it (S004-258)", async () => {
    const { service, repo } = makeService(db.pool);
    const caller = await newParent(service);
    const guest = { kind: "managed", ref: "guest-1", root: "/workspace/team/app" };
    const managed = await childWithScope(repo, caller, "managed", {
      target: guest,
      projectRef: "guest-1",
      workDir: "/workspace/team/app",
    });
    const placed = await placeFrom(service, managed.id, caller, "src", "/workspace/team/app/./src");
    expect(await storedScope(placed.childSessionId)).toMatchObject({
      workDir: "/workspace/team/app/src",
      target: guest,
    });
    const inherited = await placeFrom(service, managed.id, caller, "own", null);
    expect(await storedScope(inherited.childSessionId)).toMatchObject({
      workDir: "/workspace/team/app",
      target: guest,
    });
    // Inside the guest's mount, but outside this caller's narrower root.
    await expect(
      placeFrom(service, managed.id, caller, "mount", "/workspace/team/other"),
    ).rejects.toMatchObject({
      code: "work_dir_outside_project",
    });
    await service.whenIdle();
  });

  it("a Windows placement on a paired computer reaches the database, each turn request and a continuation unchanged (S004-080)", async () => {
    const { seen, runner } = recording();
    const { service, repo } = makeService(db.pool, { runner });
    const caller = await newParent(service);
    const laptop = await childWithScope(repo, caller, "laptop", {
      target: { kind: "local", targetId: "laptop" },
      workDir: "C:\\Users\\owner",
    });
    const win = "C:\\Users\\owner\\repo";
    const first = await service.delegate({
      parentSessionId: laptop.id,
      principalAccountId: caller.account.id,
      toolCallId: "win",
      task: scriptTask({ answer: "first" }),
      mode: "foreground",
      workDir: win,
    });
    if (first.kind !== "result") throw new Error("expected a result");
    expect(await storedScope(first.childSessionId)).toMatchObject({
      workDir: win,
      target: { kind: "local", targetId: "laptop" },
    });
    const again = await continueForeground(
      service,
      { parent: laptop, account: caller.account },
      first.childSessionId,
      "again",
      scriptTask({ answer: "again" }),
    );
    expect(again).toMatchObject({ kind: "result", body: "again" });
    expect(seen.filter((r) => r.sessionId === first.childSessionId).map((r) => r.workDir)).toEqual([
      win,
      win,
    ]);
    await service.whenIdle();
  });

  it("a child's directory is checked against the delegating account's policy as it is now: an owner's free pick is refused once it is no longer owner (S004-255)", async () => {
    const anywhere = realpathSync(mkdtempSync(join(tmpdir(), "crw-anywhere-")));
    const { service } = makeService(db.pool);
    const caller = await newParent(service, { isOwner: true });
    const first = await placeFrom(service, caller.parent.id, caller, "as-owner", anywhere);
    expect(await storedScope(first.childSessionId)).toMatchObject({
      workDir: anywhere,
      target: { kind: "host", ref: null },
    });
    await db.pool.query("update accounts set is_owner = false where id = $1::uuid", [caller.account.id]);
    await expect(placeFrom(service, caller.parent.id, caller, "demoted", anywhere)).rejects.toMatchObject({
      code: "work_dir_not_permitted",
    });
    await service.whenIdle();
    rmSync(anywhere, { recursive: true, force: true });
  });
});

/**
 * A parent whose account is granted Read, Grep and Probe and denied Bash delegates with Read, Write and
 * Probe allowed and Grep(secret*) denied; the child's turn runs Probe, which reads the child's stored scope
 * while the child runs.
 */
describe("the scope a child is given", () => {
  let text: string | undefined;
  let seenByTheChild: string | null | undefined;
  let accountId: string;
  beforeAll(async () => {
    let parentId = "";
    const probe = probeTool(async () => {
      const r = await db.pool.query<{ scope: string | null }>(
        "select scope from sessions where parent_session_id = $1",
        [parentId],
      );
      seenByTheChild = r.rows[0]?.scope;
    });
    const { service } = makeService(db.pool, { tools: () => [probe] });
    const { account, parent } = await newParent(service, {
      toolAllow: ["Read", "Grep", "Probe"],
      toolDeny: ["Bash"],
    });
    parentId = parent.id;
    accountId = account.id;
    const r = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "d",
      task: scriptTask({ rounds: [[{ name: "Probe", arguments: {} }]], answer: "done" }),
      mode: "foreground",
      tools: { allow: ["Read", "Write", "Probe"], deny: ["Grep(secret*)"] },
    });
    if (r.kind !== "result") throw new Error("expected result");
    text = (
      await db.pool.query<{ scope: string }>("select scope from sessions where id = $1", [r.childSessionId])
    ).rows[0]?.scope;
  });

  it("is captured against the caller's authority and stored before the child runs: its own turn reads it (S004-190)", () => {
    expect(seenByTheChild).toBeTruthy();
    expect(seenByTheChild).toBe(text);
    // what the running child read is already the captured form: narrowed by the account, canonical
    const seen = JSON.parse(seenByTheChild ?? "null");
    expect(seen.tools.allow.sort()).toEqual(["Probe", "Read"]);
    expect(seen.tools.deny).toContain("Bash");
    expect(seenByTheChild).toBe(canonicalJson(seen));
  });

  it("allows only the tools both asked for and granted to the account (S004-193)", () => {
    expect(JSON.parse(text ?? "null").tools.allow.sort()).toEqual(["Probe", "Read"]);
  });

  it("denies what the account denies and what the call denies (S004-194)", () => {
    expect(JSON.parse(text ?? "null").tools.deny.sort()).toEqual(["Bash", "Grep(secret*)"]);
  });

  it("is stored as canonical JSON of its own: sorted keys, no whitespace, the account named (S004-195)", () => {
    expect(text).toBe(canonicalJson(JSON.parse(text ?? "null")));
    expect(JSON.parse(text ?? "null").accountId).toBe(accountId);
  });
});

/**
 * An owner delegates into a registered project's directory, then continues the child twice: once the
 * directory belongs to another registered project, then once it is gone.
 */
describe("a child's working directory, admitted again on every call", () => {
  let root: string;
  let scope: Record<string, unknown>;
  let moved: unknown;
  let vanished: unknown;
  const turns: number[] = [];
  beforeAll(async () => {
    root = realpathSync(mkdtempSync(join(tmpdir(), "crw-proj-")));
    const projects = new Map([["p1", root]]);
    const projectForPath = (dir: string) => {
      for (const [ref, r] of projects) if (dir === r || dir.startsWith(`${r}/`)) return { ref, root: r };
      return undefined;
    };
    const { service, repo } = makeService(db.pool, { projects: { projectForPath } });
    const { account, parent } = await newParent(service, { isOwner: true });
    const first = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "d",
      task: "t",
      mode: "foreground",
      workDir: root,
    });
    if (first.kind !== "result") throw new Error("expected result");
    scope = await storedScope(first.childSessionId);
    const answers = async () =>
      messages(await repo.readJournal(first.childSessionId, account.id)).filter((m) => m.role === "assistant")
        .length;
    const cont = (id: string) =>
      continueForeground(service, { parent, account }, first.childSessionId, id, "again");
    turns.push(await answers());
    projects.set("p2", root);
    projects.delete("p1");
    moved = await cont("c1");
    turns.push(await answers());
    projects.set("p1", root);
    projects.delete("p2");
    rmSync(root, { recursive: true });
    vanished = await cont("c2");
    turns.push(await answers());
  });

  it("the child's scope stores its working directory with its execution target (S004-256)", () => {
    expect(scope).toMatchObject({ workDir: root, target: { kind: "host", ref: "p1" }, projectRef: "p1" });
  });

  it("a directory that now belongs to another project is refused before any turn (S004-268)", () => {
    expect(moved).toMatchObject({
      kind: "result",
      outcome: "error",
      body: expect.stringMatching(/no longer belongs/),
    });
    expect(turns[1]).toBe(turns[0]);
  });

  it("a directory that vanished is refused before any turn (S004-267)", () => {
    expect(vanished).toMatchObject({ kind: "result", outcome: "error" });
    expect(turns[2]).toBe(turns[0]);
  });
});

/**
 * A dream child of the account's own top-level conversation (its run wakes again for a helper's result),
 * an ordinary child with a nested child of its own, and a dream-scoped child made under that ordinary
 * (delegated) child; every turn request is recorded.
 */
describe("the memory identity of delegated turns", () => {
  let identityOf: (sessionId: string) => unknown[];
  let ids: { parent: string; dream: string; ordinary: string; dreamUnderChild: string };
  let seenSessions: string[];
  let memory: unknown;
  beforeAll(async () => {
    const { seen, runner } = recording();
    // The helper waits at a gate until the dream's own turn has answered, so its result comes to a later
    // turn of the dream (delivered sooner, it would join the first turn's next provider request).
    const gates = new Map<string, Promise<void>>();
    const helperGate = latch();
    gates.set("helper", helperGate.promise);
    const { service, repo } = makeService(db.pool, { runner, tools: () => [gateTool("Gate", gates)] });
    const { account, parent } = await newParent(service);
    const dreamScope = captureDelegatedExecutionScope(
      { accountId: account.id, target: { kind: "host", ref: null } },
      { accountId: account.id, dream: { runId: "dream-7", accountUserId: account.id } },
    );
    const made = await repo.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "dream",
      task: gatedHelperTask("helper", "helper", { answer: "dreamt" }),
      mode: "background",
      model: "scripted",
      scope: dreamScope,
    });
    const dreaming = service.executeRun(made.run);
    await waitFor(async () => {
      const last = messages(await repo.readJournal(made.child.id, account.id)).at(-1);
      return last?.role === "assistant" && JSON.stringify(last.content).includes("dreamt");
    }, "the dream's own turn answered");
    helperGate.open();
    await dreaming;
    const ordinary = await delegateForeground(
      service,
      { parent, account },
      "plain",
      scriptTask({ rounds: [[delegateCall({ answer: "nested" })]], answer: "plain done" }),
    );
    if (ordinary.kind !== "result") throw new Error("expected result");
    const underChild = await repo.createDelegation({
      parentSessionId: ordinary.childSessionId,
      principalAccountId: account.id,
      toolCallId: "dream-under-child",
      task: scriptTask({ answer: "not mine to dream" }),
      mode: "background",
      model: "scripted",
      scope: dreamScope,
    });
    await service.executeRun(underChild.run);
    await service.whenIdle();
    identityOf = (sessionId) => seen.filter((r) => r.sessionId === sessionId).map((r) => r.identity);
    seenSessions = seen.map((r) => r.sessionId);
    ids = {
      parent: parent.id,
      dream: made.child.id,
      ordinary: ordinary.childSessionId,
      dreamUnderChild: underChild.child.id,
    };
    memory = {
      principalAccountId: account.id,
      memoryIdentity: { elowenUserId: account.id, dreamRunId: "dream-7" },
    };
  });

  const noMemory = (identities: unknown[]) =>
    identities.length > 0 &&
    identities.every((i) => (i as { memoryIdentity?: unknown })?.memoryIdentity === undefined);

  it("memory identity only for a dream scope under the account's own top-level conversation, not under a delegated parent (S004-571)", () => {
    expect(identityOf(ids.dream)[0]).toEqual(memory);
    expect(noMemory(identityOf(ids.dreamUnderChild))).toBe(true);
  });

  it("an ordinary delegated child, and its own child, get no memory identity (S004-573)", () => {
    expect(noMemory(identityOf(ids.ordinary))).toBe(true);
    const nested = [...new Set(seenSessions)].filter((id) => !Object.values(ids).includes(id));
    expect(nested.length).toBeGreaterThan(0);
    for (const id of nested) expect(noMemory(identityOf(id))).toBe(true);
  });

  it("the dream's later turn for a helper's result keeps the memory identity with no wrapper around it (S004-576)", () => {
    expect(identityOf(ids.dream)).toEqual([memory, memory]);
  });
});
