import { journalRows } from "@crw/tools/delegation";
import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import type { MutatingTool } from "../../src/delegation/scopedTools.js";
import { readOnlyContinuationScope, recoverDelegations } from "../../src/index.js";
import {
  answeredChild,
  continueForeground,
  delegateCall,
  gateTool,
  latch,
  makeService,
  messages,
  newParent,
  probeTool,
  recording,
  scriptTask,
  waitFor,
  writeTool,
} from "./helpers.js";

const db = useTestDatabase();

async function childWithAnswer(extra: MutatingTool[] = []) {
  const gates = new Map<string, Promise<void>>();
  const { service, repo } = makeService(db.pool, {
    tools: () => [gateTool("Gate", gates), writeTool, ...extra],
  });
  const { account, parent } = await newParent(service);
  const child = await answeredChild(service, { parent, account }, "d1", "first answer");
  return { service, repo, account, parent, child, gates };
}

describe("DelegateContinue and the read-only clamp", () => {
  it("write access stays refused from a read-only turn; nothing is written (S004-227)", async () => {
    const { service, account, parent, child } = await childWithAnswer();
    await expect(
      service.continueSubagent({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        childSessionId: child,
        toolCallId: "w1",
        text: "write please",
        mode: "foreground",
        callerReadOnly: true,
        writeAccess: true,
      }),
    ).rejects.toMatchObject({ code: "write_access_refused" });
    const rows = await db.pool.query("select 1 from subagent_runs where tool_call_id = 'w1'");
    expect(rows.rowCount).toBe(0);
  });

  it("the ownership guard: another parent or another principal can neither continue a child (no progress reaches it) nor read its stored text (S004-296)", async () => {
    const { service, account, parent, child } = await childWithAnswer();
    const otherParent = await service.createRootSession(account.id, "scripted");
    const { account: otherAccount } = await newParent(service);
    // the child's own parent and principal read it; each guarded caller below differs in one of the two
    expect(await service.readSubagent(parent.id, child, account.id)).toBe("first answer");
    const guarded = [
      { parentSessionId: otherParent.id, principalAccountId: account.id },
      { parentSessionId: parent.id, principalAccountId: otherAccount.id },
    ];
    for (const [i, caller] of guarded.entries()) {
      const progress: unknown[] = [];
      await expect(
        service.continueSubagent({
          ...caller,
          childSessionId: child,
          toolCallId: `x${i}`,
          text: "hi",
          mode: "foreground",
          progress: (e) => progress.push(e),
        }),
      ).rejects.toMatchObject({ code: "not_found" });
      expect(progress).toEqual([]);
      await expect(
        service.readSubagent(caller.parentSessionId, child, caller.principalAccountId),
      ).rejects.toMatchObject({ code: "not_found" });
      expect(
        (
          await db.pool.query(
            "select 1 from subagent_runs where child_session_id = $1 and tool_call_id = $2",
            [child, `x${i}`],
          )
        ).rowCount,
      ).toBe(0);
    }
  });

  it("DelegateContinue under a different target is refused before dispatch; nothing is written", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const { child } = await repo.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "elsewhere",
      task: "t",
      mode: "background",
      model: "scripted",
      scope: JSON.stringify({ accountId: account.id, target: { kind: "local", targetId: "pc-1" } }),
    });
    await db.pool.query("update subagent_runs set status = 'succeeded' where child_session_id = $1", [
      child.id,
    ]);
    await expect(
      continueForeground(service, { parent, account }, child.id, "c", "go on"),
    ).rejects.toMatchObject({ code: "invalid_authority" });
    expect((await db.pool.query("select 1 from subagent_runs where tool_call_id = 'c'")).rowCount).toBe(0);
  });

  it("a terminal host-owned dream run is not continuable (S004-250)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const { child } = await repo.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "dream",
      task: "dream",
      mode: "background",
      model: "scripted",
      scope: JSON.stringify({
        accountId: account.id,
        target: { kind: "host", ref: null },
        dream: { runId: "dream-1", accountUserId: account.id },
      }),
    });
    await db.pool.query("update subagent_runs set status = 'succeeded' where child_session_id = $1", [
      child.id,
    ]);
    await expect(
      continueForeground(service, { parent, account }, child.id, "again", "more"),
    ).rejects.toMatchObject({ code: "invalid_input", context: { dreamRunId: "dream-1" } });
    expect((await db.pool.query("select 1 from subagent_runs where tool_call_id = 'again'")).rowCount).toBe(
      0,
    );
  });
});

/**
 * A child that answered once is continued from a read-only (plan mode) turn of its parent, through the
 * parent's DelegateContinue tool, after the account's grant was narrowed: the continuation tries to Write
 * and runs a Probe that reads its own run row while the turn runs; then a Build continuation writes.
 */
describe("a continuation from a read-only turn", () => {
  let ctx: Awaited<ReturnType<typeof childWithAnswer>>;
  let roScope: Record<string, unknown>;
  let seenByTheTurn: string | null | undefined;
  let childMsgs: ReturnType<typeof messages>;
  let storedScope: Record<string, unknown>;
  let parentMsgs: ReturnType<typeof messages>;
  let build: unknown;

  beforeAll(async () => {
    let child = "";
    const probe = probeTool(async () => {
      const r = await db.pool.query<{ read_only_scope: string | null }>(
        "select read_only_scope from subagent_runs where child_session_id = $1 and status = 'running'",
        [child],
      );
      seenByTheTurn = r.rows[0]?.read_only_scope;
    });
    ctx = await childWithAnswer([probe]);
    const { service, repo, account, parent } = ctx;
    child = ctx.child;
    const stored = await db.pool.query<{ scope: string }>("select scope from sessions where id = $1", [
      child,
    ]);
    storedScope = JSON.parse(stored.rows[0]?.scope ?? "null");
    // the caller's current access is narrower than when the child was made
    await db.pool.query("update accounts set tool_deny = '{Nuke}' where id = $1", [account.id]);
    const task = scriptTask({
      rounds: [[{ name: "Probe", arguments: {} }], [{ name: "Write", arguments: {} }]],
      answer: "tried",
    });
    await service.prompt(
      parent.id,
      account.id,
      scriptTask({
        rounds: [[{ name: "DelegateContinue", arguments: { sessionId: child, text: task } }]],
        answer: "planned",
      }),
      { readOnly: true },
    );
    const run = await db.pool.query<{ read_only_scope: string }>(
      "select read_only_scope from subagent_runs where parent_session_id = $1 and tool_call_id <> 'd1'",
      [parent.id],
    );
    expect(run.rows).toHaveLength(1);
    roScope = JSON.parse(run.rows[0]?.read_only_scope ?? "null");
    childMsgs = messages(await repo.readJournal(child, account.id));
    parentMsgs = messages(await repo.readJournal(parent.id, account.id));
    build = await continueForeground(
      service,
      { parent, account },
      child,
      "c2",
      scriptTask({ rounds: [[{ name: "Write", arguments: {} }]], answer: "wrote" }),
    );
  });

  it("a DelegateContinue from a read-only parent turn runs the whole delegated call read-only: its Write is refused (S004-212)", () => {
    expect(
      parentMsgs.find((m) => m.role === "toolResult" && m.toolName === "DelegateContinue"),
    ).toMatchObject({ isError: false, content: expect.stringContaining("tried") });
    expect(childMsgs.find((m) => m.role === "toolResult" && m.toolName === "Write")).toMatchObject({
      isError: true,
      content: expect.stringMatching(/^tool_not_allowed: .*read-only/),
    });
  });

  it("mints the read-only scope from the child's stored scope narrowed by the caller's current grant, made read-only (S004-213)", () => {
    expect(roScope).toMatchObject({ readOnly: true, permissionBoundary: "read-only" });
    const { readOnly: _r, permissionBoundary: _p, tools, ...rest } = roScope;
    const { readOnly: _r2, permissionBoundary: _p2, tools: storedTools, ...storedRest } = storedScope;
    expect(rest).toEqual(storedRest);
    const stored = storedTools as { deny: string[] };
    expect(stored.deny).not.toContain("Nuke");
    expect(tools).toEqual({ ...stored, deny: [...stored.deny, "Nuke"].sort() });
  });

  it("binds that scope to the call's own row before the call runs: its turn sees it (S004-214)", () => {
    expect(seenByTheTurn).toBeTruthy();
    expect(JSON.parse(seenByTheTurn as string)).toEqual(roScope);
  });

  it("a call not asked from a read-only turn, a Delegate or a Build continuation, has no read-only scope (S004-222)", async () => {
    const plain = await db.pool.query<{ tool_call_id: string; read_only_scope: string | null }>(
      `select tool_call_id, read_only_scope from subagent_runs
        where parent_session_id = $1 and tool_call_id in ('d1', 'c2') order by tool_call_id`,
      [ctx.parent.id],
    );
    expect(plain.rows).toEqual([
      { tool_call_id: "c2", read_only_scope: null },
      { tool_call_id: "d1", read_only_scope: null },
    ]);
  });

  it("the settled read-only call does not constrain a later Build continuation: it writes (S004-224)", async () => {
    expect(build).toMatchObject({ kind: "result", body: "wrote" });
    const after = messages(await ctx.repo.readJournal(ctx.child, ctx.account.id));
    expect(after.filter((m) => m.role === "toolResult" && m.toolName === "Write").at(-1)).toMatchObject({
      isError: false,
    });
  });
});

/**
 * A child with an open Build call (its turn waits on a gate): a planning caller and a Build caller come
 * in; once that call settles, a read-only call is opened and a Build caller comes in again.
 */
describe("callers of a child with an open call", () => {
  let planning: unknown;
  let steered: { kind: string; steerId?: string } | undefined;
  let receipts: Array<{ id: string; status: string; journal_seq: string | null; body: string | null }>;
  let progress: string[];
  let openReadOnly: { status: string; readOnlyScope: string | null } | null;
  let buildIntoReadOnly: unknown;
  let steersAfter: number | null;

  beforeAll(async () => {
    const { service, repo, account, parent, child, gates } = await childWithAnswer();
    const hold = latch();
    gates.set("busy", hold.promise);
    progress = [];
    const busy = await service.continueSubagent({
      progress: (e) => {
        if (e.type === "text") progress.push(e.text);
      },
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child,
      toolCallId: "b1",
      text: scriptTask({ rounds: [[{ name: "Gate", arguments: { key: "busy" } }]], answer: "busy done" }),
      mode: "background",
    });
    expect(busy.kind).toBe("started");
    await waitFor(
      async () => (await repo.openRunForChild(child, account.id))?.status === "running",
      "running",
    );
    planning = await service
      .continueSubagent({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        childSessionId: child,
        toolCallId: "p1",
        text: "plan",
        mode: "foreground",
        callerReadOnly: true,
      })
      .catch((e: unknown) => e);
    steered = await continueForeground(service, { parent, account }, child, "s1", "also do this");
    hold.open();
    await waitFor(async () => (await repo.openRunForChild(child, account.id)) === null, "settled");
    await service.whenIdle();
    receipts = (
      await db.pool.query<{ id: string; status: string; journal_seq: string | null; body: string | null }>(
        `select d.id, d.status, d.journal_seq, j.body from delegated_steers d
           left join journal_entries j on j.session_id = d.child_session_id and j.seq = d.journal_seq
          where d.child_session_id = $1`,
        [child],
      )
    ).rows;
    const ro = latch();
    gates.set("ro", ro.promise);
    await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child,
      toolCallId: "r1",
      text: scriptTask({ rounds: [[{ name: "Gate", arguments: { key: "ro" } }]], answer: "ro done" }),
      mode: "background",
      callerReadOnly: true,
    });
    openReadOnly = await waitFor(async () => {
      const open = await repo.openRunForChild(child, account.id);
      return open?.status === "running" ? open : undefined;
    }, "running read-only call");
    buildIntoReadOnly = await continueForeground(service, { parent, account }, child, "b2", "build").catch(
      (e: unknown) => e,
    );
    steersAfter = (await db.pool.query("select 1 from delegated_steers where child_session_id = $1", [child]))
      .rowCount;
    ro.open();
    await waitFor(
      async () => (await repo.openRunForChild(child, account.id)) === null,
      "read-only call settled",
    );
    await service.whenIdle();
  });

  it("a planning caller must wait for the active child: a retryable wait_required (S004-225)", () => {
    expect(planning).toMatchObject({ code: "wait_required", retryable: true });
  });

  it("a Build caller's text steers an open Build call, and its receipt is delivered into the child's journal (S004-040)", () => {
    expect(steered?.kind).toBe("steered");
    // the caller's receipt is the committed steer row, which names the journal row carrying its text
    expect(receipts.map((r) => [r.id, r.status])).toEqual([[steered?.steerId, "delivered"]]);
    expect(receipts[0]?.body).toContain("also do this");
    // the steered text was taken by the open call, whose activity reached the call's progress sink once
    expect(progress).toEqual(["busy done"]);
  });

  it("a Build caller must wait for an open read-only call and never steers into it (S004-226)", () => {
    expect(buildIntoReadOnly).toMatchObject({ code: "wait_required" });
    expect(steersAfter).toBe(1);
  });

  it("a running read-only call's row holds the read-only clamp (S004-223)", () => {
    expect(openReadOnly?.status).toBe("running");
    expect(JSON.parse(String(openReadOnly?.readOnlyScope))).toMatchObject({
      readOnly: true,
      permissionBoundary: "read-only",
    });
  });
});

describe("a read-only call settling on a live helper", () => {
  it("a Build caller must wait for it too, though its turn has ended: no steer is queued and no follow-up turn takes the caller's text (S004-226)", async () => {
    const { service, repo, account, parent, child, gates } = await childWithAnswer();
    const helper = latch();
    gates.set("helper", helper.promise);
    await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child,
      toolCallId: "r1",
      text: scriptTask({
        rounds: [
          [
            delegateCall(
              { rounds: [[{ name: "Gate", arguments: { key: "helper" } }]], answer: "helper done" },
              { background: true },
            ),
          ],
        ],
        answer: "ro answered",
      }),
      mode: "background",
      callerReadOnly: true,
    });
    // the call's own turn has answered and let go of the child; the call stays open on its helper
    await waitFor(async () => {
      const answered = messages(await repo.readJournal(child, account.id)).some(
        (m) => m.role === "assistant" && JSON.stringify(m.content).includes("ro answered"),
      );
      return answered && !service.turns.isBusy(child);
    }, "the read-only call's answer");
    const open = await repo.openRunForChild(child, account.id);
    expect(open?.toolCallId).toBe("r1");
    expect(open?.readOnlyScope).not.toBeNull();

    const build = await continueForeground(service, { parent, account }, child, "b1", "build now").catch(
      (e: unknown) => e,
    );
    expect(build).toMatchObject({ code: "wait_required" });
    expect(
      (await db.pool.query("select 1 from delegated_steers where child_session_id = $1", [child])).rowCount,
    ).toBe(0);

    helper.open();
    await waitFor(async () => (await repo.openRunForChild(child, account.id)) === null, "the call settled");
    await service.whenIdle();
    const users = messages(await repo.readJournal(child, account.id)).filter((m) => m.role === "user");
    expect(users.some((m) => JSON.stringify(m.content).includes("build now"))).toBe(false);
    expect(
      (
        await db.pool.query(
          "select 1 from subagent_runs where parent_session_id = $1 and tool_call_id = 'b1'",
          [parent.id],
        )
      ).rowCount,
    ).toBe(0);
  });
});

describe("a read-only call a dead process left running", () => {
  it("is recovered under its read-only clamp: the recovered turn is read-only and its Write is refused (S004-223)", async () => {
    const { repo, account, parent, child } = await childWithAnswer();
    const stored = await repo.getSession(child, account.id);
    // the row as a process that died mid-turn leaves it: the clamp bound, the run started by that process,
    // its turn's tool call asked and its intent journaled, nothing after
    const { run } = await repo.createContinuation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child,
      toolCallId: "c1",
      task: scriptTask({
        rounds: [[{ name: "Nothing", arguments: {} }], [{ name: "Write", arguments: {} }]],
        answer: "tried",
      }),
      mode: "background",
      readOnlyScope: readOnlyContinuationScope(stored.scope ?? "", { accountId: account.id }),
    });
    await repo.startRun(run.id, run.generation, "dead-owner");
    await repo.append(child, account.id, [
      journalRows.asking("x-1", "Nothing"),
      journalRows.intent("x-1", "Nothing"),
    ]);

    // the next process: its own service, whose runner records what each turn is given
    const { seen, runner } = recording();
    const next = makeService(db.pool, { runner, tools: () => [writeTool] });
    try {
      const report = await recoverDelegations(next.service);
      expect(report.continued).toContain(run.id);
      await waitFor(
        async () => (await repo.getRun(run.id, account.id)).status === "succeeded",
        "the recovered call",
      );

      const recovered = seen.filter((r) => r.sessionId === child);
      expect(recovered.length).toBeGreaterThan(0);
      for (const request of recovered) expect(request.readOnly).toBe(true);
      const msgs = messages(await repo.readJournal(child, account.id));
      expect(msgs.find((m) => m.role === "toolResult" && m.toolName === "Write")).toMatchObject({
        isError: true,
        content: expect.stringMatching(/^tool_not_allowed: .*read-only/),
      });
      expect((await repo.getRun(run.id, account.id)).readOnlyScope).not.toBeNull();
    } finally {
      // a failed assertion must not leave the recovered call running into the next file
      await next.service.close();
    }
  });
});
