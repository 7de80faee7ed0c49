import { realpathSync } from "node:fs";
import type { JournalWrite, PgDelegationRepository } from "@crw/db";
import { journalRows } from "@crw/tools/delegation";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { type DelegationEvent, recoverDelegations } from "../../src/index.js";
import {
  makeService,
  messages,
  newParent,
  scratchDir,
  scriptTask,
  settledHelperResult,
  waitFor,
} from "./helpers.js";

/**
 * Boot recovery's edges over real PostgreSQL, beyond recovery.test.ts: the answers written for tool calls
 * of unknown outcome (what the working directory shows, a Delegate verified against its rows), the bounds
 * (claim batch, attempts, free continuations), pending input of a finished child, a run that cannot be
 * recovered, and which cut turns are charged (only a tool's own unknown-outcome answer).
 */
const db = useTestDatabase();

type Service = ReturnType<typeof makeService>["service"];

const UNKNOWN_OUTCOME =
  "interrupted: this call may or may not have taken effect before a restart; its outcome is unknown. " +
  "Verify its effect before repeating it.";

/** A delegated call of a fresh root parent, created but not started (status queued). */
async function delegation(service: Service, task: string, scope: Record<string, unknown> = {}) {
  const { account, parent } = await newParent(service);
  const d = await service.repo.createDelegation({
    parentSessionId: parent.id,
    principalAccountId: account.id,
    toolCallId: "t1",
    task,
    mode: "background",
    model: "scripted",
    scope: JSON.stringify({ accountId: account.id, target: { kind: "host", ref: null }, ...scope }),
  });
  return { account, parent, run: d.run, child: d.child.id };
}

/** A delegated call whose child a dead process had started. */
async function startedDelegation(service: Service, task: string, scope: Record<string, unknown> = {}) {
  const d = await delegation(service, task, scope);
  await service.repo.startRun(d.run.id, d.run.generation, "dead-owner");
  return d;
}

/** An assistant message asking for `calls`, and the intent row of each: a turn cut right after them. */
function cutAfter(
  calls: { id: string; name: string; arguments?: Record<string, unknown> }[],
): JournalWrite[] {
  return [
    {
      body: {
        type: "message",
        message: {
          role: "assistant",
          content: calls.map((c) => ({ type: "toolCall" as const, arguments: {}, ...c })),
          stopReason: "toolUse",
        },
      },
    },
    ...calls.map((c) => ({
      body: {
        type: "tool_intent" as const,
        toolCallId: c.id,
        toolName: c.name,
        arguments: c.arguments ?? {},
      },
    })),
  ];
}

async function settledRoots(service: Service, parentId: string, accountId: string) {
  await waitFor(
    async () => (await service.repo.queuedResultIds(parentId, accountId)).length === 0,
    "the parent's delivery",
  );
  await service.whenIdle();
}

const runRow = async (id: string) =>
  (
    await db.pool.query(
      "select status, locked_by, recovery_attempts, free_continuations from subagent_runs where id = $1",
      [id],
    )
  ).rows[0];

describe("the answer to a call of unknown outcome", () => {
  it("says the outcome is unknown, shows the working directory now, and the provisional tail is discarded", async () => {
    const { service, repo } = makeService(db.pool);
    const workDir = realpathSync(scratchDir("crw-recovery-"));
    const { account, parent, run, child } = await startedDelegation(
      service,
      scriptTask({ answer: "resumed" }),
      { workDir },
    );
    await repo.append(child, account.id, [
      journalRows.user(scriptTask({ answer: "resumed" })),
      ...cutAfter([{ id: "w-1", name: "write", arguments: { path: "notes/a.txt" } }]),
      { ...journalRows.answer("half a thought"), settled: false },
    ]);
    const report = await recoverDelegations(service);
    expect(report.unknownToolCalls).toBe(1);
    expect(report.continued).toEqual([run.id]);
    await settledRoots(service, parent.id, account.id);
    const msgs = messages(await repo.readJournal(child, account.id));
    expect(msgs.find((m) => m.role === "toolResult")).toEqual({
      role: "toolResult",
      toolCallId: "w-1",
      toolName: "write",
      isError: true,
      content:
        `${UNKNOWN_OUTCOME}\nWhat the working directory shows now:\nnotes/a.txt does not exist now\n` +
        "the working directory is not a git repository crw can read",
    });
    // the provisional row of the cut turn went; the run was charged for the uncertain call
    expect(msgs.some((m) => m.role === "assistant" && JSON.stringify(m).includes("half a thought"))).toBe(
      false,
    );
    expect(await runRow(run.id)).toMatchObject({
      status: "succeeded",
      recovery_attempts: 1,
      free_continuations: 0,
    });
    await service.close();
  });

  it("a cut Delegate is verified against its rows: one recorded arrives as a result, one never recorded started nothing", async () => {
    const events: DelegationEvent[] = [];
    const { service, repo } = makeService(db.pool, { onEvent: (e) => events.push(e) });
    const { account, parent, run } = await delegation(service, scriptTask({ answer: "never" }));
    // the parent's turn asked for two delegations; only the first one's run was recorded (tool call t1)
    await repo.append(parent.id, account.id, [
      journalRows.user("delegate twice"),
      ...cutAfter([
        { id: "t1", name: "Delegate" },
        { id: "t2", name: "DelegateContinue" },
      ]),
    ]);
    const report = await recoverDelegations(service);
    expect(report.unknownToolCalls).toBe(2);
    expect(report.terminalized).toEqual([run.id]);
    expect(events).toContainEqual({ type: "delegation.recovered", runId: run.id, action: "terminalized" });
    await settledRoots(service, parent.id, account.id);
    const msgs = messages(await repo.readJournal(parent.id, account.id));
    const answers = msgs.filter((m) => m.role === "toolResult");
    expect(answers).toEqual([
      {
        role: "toolResult",
        toolCallId: "t1",
        toolName: "Delegate",
        isError: true,
        content: `interrupted by a restart: the delegated call ${run.id} was recorded; its result arrives as a message.`,
      },
      {
        role: "toolResult",
        toolCallId: "t2",
        toolName: "DelegateContinue",
        isError: true,
        content:
          "interrupted by a restart before the delegation was recorded: nothing was started. Delegate again if it is still needed.",
      },
    ]);
    // the recorded call had never started: its error result says so, and the parent was woken
    const result = (await repo.resultForRun(run.id, account.id)) ?? undefined;
    const never = "the delegated call never started before a restart";
    expect(result).toMatchObject({ outcome: "error", body: never, byteSize: Buffer.byteLength(never) });
    expect(await repo.getRun(run.id, account.id)).toMatchObject({
      status: "failed",
      error: { code: "recovery_failed", message: "the delegated call never started before a restart" },
    });
    expect(msgs.at(-1)).toMatchObject({ role: "assistant" });
    await service.close();
  });
});

describe("a recorded call whose child is gone", () => {
  it("is terminalized with an error result that says its child was discarded before it was ready", async () => {
    const { service, repo } = makeService(db.pool);
    const d = await delegation(service, "lost");
    // a discarded child session: the run's reference to it is cleared with it
    await db.pool.query("update subagent_runs set child_session_id = null where id = $1", [d.run.id]);
    const report = await recoverDelegations(service);
    expect(report.terminalized).toEqual([d.run.id]);
    await settledRoots(service, d.parent.id, d.account.id);
    const gone = "the child session was discarded before it was ready";
    expect(await repo.resultForRun(d.run.id, d.account.id)).toMatchObject({ outcome: "error", body: gone });
    expect(await repo.getRun(d.run.id, d.account.id)).toMatchObject({
      status: "failed",
      error: { code: "recovery_failed", message: gone },
    });
    await service.close();
  });
});

describe("bounds of a boot pass", () => {
  it("claims no more runs than its claim batch; the next pass takes the rest", async () => {
    const { service } = makeService(db.pool);
    const first = await delegation(service, "one");
    const second = await delegation(service, "two");
    const report = await recoverDelegations(service, { claimBatch: 1 });
    expect(report.terminalized).toEqual([first.run.id]);
    expect((await runRow(second.run.id)).status).toBe("queued");
    expect((await recoverDelegations(service)).terminalized).toEqual([second.run.id]);
    await settledRoots(service, first.parent.id, first.account.id);
    await settledRoots(service, second.parent.id, second.account.id);
    await service.close();
  });

  it("allows three recovery attempts by default", async () => {
    const { service, repo } = makeService(db.pool);
    const charged = async (attempts: number) => {
      const d = await startedDelegation(service, scriptTask({ answer: "after the cut" }));
      await db.pool.query("update subagent_runs set recovery_attempts = $2 where id = $1", [
        d.run.id,
        attempts,
      ]);
      await repo.append(d.child, d.account.id, [
        journalRows.user("task"),
        ...cutAfter([{ id: "x", name: "Work" }]),
      ]);
      return d;
    };
    const third = await charged(2);
    const fourth = await charged(3);
    const report = await recoverDelegations(service);
    expect(report.continued).toEqual([third.run.id]);
    expect(report.failed).toEqual([fourth.run.id]);
    await settledRoots(service, third.parent.id, third.account.id);
    await settledRoots(service, fourth.parent.id, fourth.account.id);
    expect(await runRow(third.run.id)).toMatchObject({ status: "succeeded", recovery_attempts: 3 });
    expect(await repo.getRun(fourth.run.id, fourth.account.id)).toMatchObject({
      status: "failed",
      error: {
        code: "recovery_failed",
        message:
          "recovery failed after 3 attempts; verify the child's last step before using DelegateContinue",
      },
    });
    await service.close();
  });

  it("free continuations go on below five per allowed attempt", async () => {
    const { service } = makeService(db.pool);
    const d = await startedDelegation(service, scriptTask({ answer: "still going" }));
    await service.repo.append(d.child, d.account.id, [journalRows.user("the task")]);
    await db.pool.query("update subagent_runs set free_continuations = 9 where id = $1", [d.run.id]);
    const report = await recoverDelegations(service, { maxRecoveryAttempts: 2 });
    expect(report.continued).toEqual([d.run.id]);
    await settledRoots(service, d.parent.id, d.account.id);
    expect(await runRow(d.run.id)).toMatchObject({ status: "succeeded", free_continuations: 10 });
    await service.close();
  });
});

describe("a finished child with input waiting", () => {
  /** The repository without its one-read counts of a session's pending work (the methods are optional). */
  const withoutSettlementWork = (repo: PgDelegationRepository) =>
    new Proxy(repo, {
      get: (t, key, receiver) =>
        key === "settlementWork" || key === "journalTailWithWork" ? undefined : Reflect.get(t, key, receiver),
    });

  for (const [what, bare] of [
    ["", false],
    [" (a repository that counts them one by one)", true],
  ] as const) {
    it(`continues without the interrupted context when a steer and a result wait for it${what}`, async () => {
      const { repo: real } = makeService(db.pool);
      const { service, repo } = makeService(db.pool, bare ? { repo: withoutSettlementWork(real) } : {});
      const script = scriptTask({ answer: "first answer", followUp: "took it" });
      const d = await startedDelegation(service, script);
      await repo.append(d.child, d.account.id, [
        journalRows.user(script),
        journalRows.answer("first answer"),
      ]);
      await repo.enqueueSteer(d.child, d.account.id, "one more thing");
      const childRow = await repo.getSession(d.child, d.account.id);
      await settledHelperResult(real, childRow, d.account.id, "h1", "helper's late news");
      const report = await recoverDelegations(service);
      expect(report.continued).toEqual([d.run.id]);
      expect(report.settledWithoutTurn).toEqual([]);
      await settledRoots(service, d.parent.id, d.account.id);
      const msgs = messages(await repo.readJournal(d.child, d.account.id));
      expect(msgs.some((m) => m.role === "custom" && m.customType === "interrupted")).toBe(false);
      expect(msgs.some((m) => m.role === "user" && m.content === "one more thing")).toBe(true);
      // one turn took both: no turn ran before the waiting input was handed over
      const answers = msgs.filter((m) => m.role === "assistant");
      expect(answers).toHaveLength(2);
      expect(JSON.stringify(answers[1])).toContain("took it");
      expect(await runRow(d.run.id)).toMatchObject({
        status: "succeeded",
        recovery_attempts: 0,
        free_continuations: 1,
      });
      await service.close();
    });
  }

  it("a finished child with nothing waiting settles with its own answer, and no turn is added", async () => {
    const { service, repo } = makeService(db.pool);
    const d = await startedDelegation(service, "finished task");
    await repo.append(d.child, d.account.id, [
      journalRows.user("finished task"),
      journalRows.answer("all done"),
    ]);
    const report = await recoverDelegations(service);
    expect(report.settledWithoutTurn).toEqual([d.run.id]);
    await settledRoots(service, d.parent.id, d.account.id);
    // the start journaled the task; the staged answer is the last row still
    expect(messages(await repo.readJournal(d.child, d.account.id)).map((m) => m.role)).toEqual([
      "user",
      "user",
      "assistant",
    ]);
    expect((await repo.resultForRun(d.run.id, d.account.id))?.body).toBe("all done");
    await service.close();
  });

  it("boot follows up root parents only: a delegated child's queued result waits for its own turn", async () => {
    const { service, repo } = makeService(db.pool);
    const d = await delegation(service, "done already");
    await repo.settleRun({
      runId: d.run.id,
      generation: d.run.generation,
      resultId: crypto.randomUUID(),
      outcome: "ok",
      body: "done",
      byteSize: 4,
    });
    const childRow = await repo.getSession(d.child, d.account.id);
    await settledHelperResult(repo as PgDelegationRepository, childRow, d.account.id, "h1", "late");
    await recoverDelegations(service);
    await settledRoots(service, d.parent.id, d.account.id);
    expect(await repo.queuedResultIds(d.child, d.account.id)).toHaveLength(1);
    expect(messages(await repo.readJournal(d.child, d.account.id))).toEqual([]);
    await service.close();
  });
});

describe("a run that cannot be recovered", () => {
  /** The repository with the methods `methods` answering `answer` for the run or session `target`, once. */
  function failingOnce(repo: PgDelegationRepository, methods: string[], answer: () => Promise<unknown>) {
    let target: string | undefined;
    const proxy = new Proxy(repo, {
      get(t, key, receiver) {
        const value = Reflect.get(t, key, receiver) as unknown;
        if (typeof key !== "string" || !methods.includes(key) || typeof value !== "function") return value;
        return (...args: unknown[]) => {
          // a batched method's first argument lists the sessions or runs it is for
          const names = (e: { sessionId?: string; runId?: string } | undefined) =>
            e?.sessionId === target || e?.runId === target;
          const of = (x: unknown) =>
            x === target ||
            (Array.isArray(x) ? x.some(names) : typeof x === "object" && x !== null && names(x));
          if (target !== undefined && of(args[0])) {
            target = undefined;
            return answer();
          }
          return (value as (...a: unknown[]) => unknown).apply(t, args);
        };
      },
    });
    return { repo: proxy, failFor: (id: string) => (target = id) };
  }

  it("fails the boot with its own error, after starting the runs already recovered", async () => {
    const { repo: real } = makeService(db.pool);
    // the child's journal cannot be read (a lost connection), whichever read recovery uses
    const failing = failingOnce(
      real,
      ["readJournal", "readJournalTail", "journalTailWithWork", "journalTailsWithWork"],
      () => Promise.reject(new Error("connection terminated unexpectedly")),
    );
    const { service } = makeService(db.pool, { repo: failing.repo });
    const done = await startedDelegation(service, "finished");
    await real.append(done.child, done.account.id, [
      journalRows.user("finished"),
      journalRows.answer("all done"),
    ]);
    const broken = await startedDelegation(service, scriptTask({ answer: "later" }));
    failing.failFor(broken.child);
    await expect(recoverDelegations(service, { batch: 1 })).rejects.toThrow(
      "connection terminated unexpectedly",
    );
    // the finished child recovered before the failure still settles and reaches its parent
    await waitFor(
      async () => (await real.getRun(done.run.id, done.account.id)).status === "succeeded",
      "the finished run",
      10_000,
    );
    await settledRoots(service, done.parent.id, done.account.id);
    await service.close();
    // the next boot takes the broken run and finishes it
    const next = makeService(db.pool);
    expect((await recoverDelegations(next.service)).continued).toEqual([broken.run.id]);
    await settledRoots(next.service, broken.parent.id, broken.account.id);
    await next.service.close();
  });

  it("a run whose own recovery step fails fails the boot with that error; the rest of its batch goes on", async () => {
    const { repo: real } = makeService(db.pool);
    // the error result of a call that never started cannot be settled (a lost connection), once
    const failing = failingOnce(real, ["settleRun"], () =>
      Promise.reject(new Error("connection terminated while settling")),
    );
    const { service } = makeService(db.pool, { repo: failing.repo });
    const never = await delegation(service, "never started");
    const waiting = await startedDelegation(service, scriptTask({ answer: "went on" }));
    await real.append(waiting.child, waiting.account.id, [journalRows.user("went on")]);
    failing.failFor(never.run.id);
    await expect(recoverDelegations(service)).rejects.toThrow("connection terminated while settling");
    // the other run of the same batch was continued and settles
    await waitFor(
      async () => (await real.getRun(waiting.run.id, waiting.account.id)).status === "succeeded",
      "the continued run",
      10_000,
    );
    expect((await runRow(never.run.id)).status).toBe("queued");
    await settledRoots(service, waiting.parent.id, waiting.account.id);
    await service.close();
    // the next boot settles the call that never started, with its error result
    const next = makeService(db.pool);
    expect((await recoverDelegations(next.service)).terminalized).toEqual([never.run.id]);
    await settledRoots(next.service, never.parent.id, never.account.id);
    await next.service.close();
  });

  it("a run moved on by another generation meanwhile is reported failed and left open, charged or free", async () => {
    const { repo: real } = makeService(db.pool);
    // another process takes the two runs' next generation just before this recovery's statement does
    const movedOn = new Set<string>();
    const repo = new Proxy(real, {
      get(t, key, receiver) {
        const value = Reflect.get(t, key, receiver) as unknown;
        if (key !== "nextGenerations" || typeof value !== "function") return value;
        return async (...args: unknown[]) => {
          await db.pool.query(
            "update subagent_runs set generation = generation + 1 where id = any($1::uuid[])",
            [[...movedOn]],
          );
          return (value as (...a: unknown[]) => unknown).apply(t, args);
        };
      },
    });
    const { service } = makeService(db.pool, { repo });
    const charged = await startedDelegation(service, scriptTask({ answer: "c" }));
    await real.append(charged.child, charged.account.id, [
      journalRows.user("task"),
      ...cutAfter([{ id: "x", name: "Work" }]),
    ]);
    const free = await startedDelegation(service, scriptTask({ answer: "f" }));
    await real.append(free.child, free.account.id, [journalRows.user("task")]);
    movedOn.add(charged.run.id).add(free.run.id);
    const report = await recoverDelegations(service);
    expect(report.failed.slice().sort()).toEqual([charged.run.id, free.run.id].sort());
    await service.whenIdle();
    expect(await runRow(charged.run.id)).toMatchObject({ status: "running", recovery_attempts: 0 });
    expect(await runRow(free.run.id)).toMatchObject({ status: "running", free_continuations: 0 });
    await service.close();
    const next = makeService(db.pool);
    expect((await recoverDelegations(next.service)).continued.length).toBe(2);
    await settledRoots(next.service, charged.parent.id, charged.account.id);
    await settledRoots(next.service, free.parent.id, free.account.id);
    await next.service.close();
  });

  it("decides the claimed runs in batches, 8 first and then 64: one journal read a batch, and a generation statement only when some run of it goes on", async () => {
    const { repo: real } = makeService(db.pool);
    const calls: Record<string, number[]> = { journalTailsWithWork: [], nextGenerations: [] };
    // records how many runs each batched statement was for
    const counting = new Proxy(real, {
      get(t, key, receiver) {
        const value = Reflect.get(t, key, receiver) as unknown;
        if (typeof key !== "string" || !(key in calls) || typeof value !== "function") return value;
        return (...args: unknown[]) => {
          calls[key]?.push((args[0] as unknown[]).length);
          return (value as (...a: unknown[]) => unknown).apply(t, args);
        };
      },
    });
    // by default a first batch of 8, then batches of 64; or the batch asked for
    for (const [batch, runs, sizes] of [
      [undefined, 20, [8, 12]],
      [3, 10, [3, 3, 3, 1]],
    ] as const) {
      calls.journalTailsWithWork = [];
      calls.nextGenerations = [];
      const { service } = makeService(db.pool, { repo: counting });
      const ds = [];
      for (let i = 0; i < runs; i++) {
        const d = await startedDelegation(service, `waiting ${i}`);
        await real.append(d.child, d.account.id, [journalRows.user(`waiting ${i}`)]);
        ds.push(d);
      }
      const report = await recoverDelegations(service, batch ? { batch } : {});
      expect(report.continued).toHaveLength(runs);
      expect(calls.journalTailsWithWork).toEqual(sizes);
      expect(calls.nextGenerations).toEqual(sizes);
      for (const d of ds) await settledRoots(service, d.parent.id, d.account.id);
      for (const d of ds) expect(await runRow(d.run.id)).toMatchObject({ free_continuations: 1 });
      await service.close();
    }
    // a batch whose runs all settle from their journals (finished children) takes no generation
    calls.journalTailsWithWork = [];
    calls.nextGenerations = [];
    const { service } = makeService(db.pool, { repo: counting });
    const finished = [];
    for (let i = 0; i < 2; i++) {
      const d = await startedDelegation(service, `finished ${i}`);
      await real.append(d.child, d.account.id, [
        journalRows.user(`finished ${i}`),
        journalRows.answer("done"),
      ]);
      finished.push(d);
    }
    const report = await recoverDelegations(service);
    expect(report.settledWithoutTurn).toHaveLength(2);
    expect(calls.journalTailsWithWork).toEqual([2]);
    expect(calls.nextGenerations).toEqual([]);
    for (const d of finished) await settledRoots(service, d.parent.id, d.account.id);
    await service.close();
  });
});

describe("a cut turn whose tool calls all answered", () => {
  /** A turn that asked for one tool call, recorded its intent, and got the tool's answer. */
  const answeredCall = (id: string, name: string, answer: string): JournalWrite[] => [
    ...cutAfter([{ id, name }]),
    {
      body: {
        type: "message",
        message: { role: "toolResult", toolCallId: id, toolName: name, content: answer, isError: false },
      },
    },
  ];

  /** Recovers the child cut after `tail` and returns its journal; the continuation was free. */
  async function continuedFree(tail: JournalWrite[]) {
    const { service, repo } = makeService(db.pool);
    const script = scriptTask({ answer: "went on" });
    const d = await startedDelegation(service, script);
    await repo.append(d.child, d.account.id, [journalRows.user(script), ...tail]);
    const report = await recoverDelegations(service);
    expect(report.continued).toEqual([d.run.id]);
    expect(report.unknownToolCalls).toBe(0);
    await settledRoots(service, d.parent.id, d.account.id);
    expect(await runRow(d.run.id)).toMatchObject({
      status: "succeeded",
      recovery_attempts: 0,
      free_continuations: 1,
    });
    const msgs = messages(await repo.readJournal(d.child, d.account.id));
    await service.close();
    return msgs;
  }

  it("continues free: a known tool answer after an intent row costs no recovery attempt", async () => {
    const msgs = await continuedFree(answeredCall("c-1", "Work", "the work is done"));
    // the answered call was left as it was: no unknown-outcome answer was written for it
    expect(msgs.filter((m) => m.role === "toolResult")).toHaveLength(1);
    expect(msgs.some((m) => m.role === "custom" && m.customType === "interrupted")).toBe(true);
  });

  it("continues free when a later user message quotes the unknown-outcome text: only a tool's answer counts", async () => {
    await continuedFree([
      ...answeredCall("c-1", "Work", "the work is done"),
      journalRows.user(`${UNKNOWN_OUTCOME} (quoted by the user)`),
    ]);
  });
});
