import type { AssistantMessage, ToolCallContent } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import type pg from "pg";
import { describe, expect, it } from "vitest";
import {
  DelegationError,
  type DelegationEvent,
  RestartCheckpointError,
  type SessionTurnRunner,
  type TurnOutcome,
} from "../../src/index.js";
import {
  delegateBackground,
  latch,
  makeService,
  messages,
  newParent,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

const call = (id: string): ToolCallContent => ({ type: "toolCall", id, name: "Work", arguments: { id } });

/**
 * A runner speaking the seam the way a runner process does over its socket: the host's calls are answered
 * concurrently, so a finished tool's result can be reported while the previous journal write is still in
 * flight. Stage 1: the assistant message and the first intent are durable. Stage 2 (after `go`): the second
 * call's intent and the first call's result are reported together. Then the next model request blocks
 * until `model` opens.
 */
function overlappingRunner() {
  const stage1 = latch();
  const go = latch();
  const stage2 = latch();
  const model = latch();
  const state = { modelReturned: false, reported: [] as Promise<void>[], lateWrite: undefined as unknown };
  const runner: SessionTurnRunner = {
    async runTurn(_request, host): Promise<TurnOutcome> {
      const asking: AssistantMessage = {
        role: "assistant",
        content: [call("t1"), call("t2")],
        stopReason: "toolUse",
      };
      await host.record(asking);
      await host.beforeToolCall(call("t1"));
      stage1.open();
      await go.promise;
      state.reported.push(host.beforeToolCall(call("t2")));
      state.reported.push(
        host.record({
          role: "toolResult",
          toolCallId: "t1",
          toolName: "Work",
          content: "t1 done",
          isError: false,
        }),
      );
      for (const p of state.reported) p.catch(() => {});
      stage2.open();
      // The next provider request: blocked until the test lets it answer (bounded).
      await Promise.race([model.promise, new Promise((r) => setTimeout(r, 15_000))]);
      state.modelReturned = true;
      try {
        await host.record({
          role: "assistant",
          content: [{ type: "text", text: "late" }],
          stopReason: "stop",
        });
      } catch (e) {
        state.lateWrite = e;
        return { stopReason: "error", errorMessage: (e as Error).message };
      }
      return { stopReason: "stop" };
    },
  };
  return { runner, stage1, go, stage2, model, state };
}

/** Holds the session's row lock from another connection, so the next journal append waits in PostgreSQL. */
async function lockSession(pool: pg.Pool, sessionId: string) {
  const client = await pool.connect();
  await client.query("begin");
  const { rows } = await client.query<{ next_seq: string }>(
    "select next_seq from sessions where id = $1 for update",
    [sessionId],
  );
  return { client, nextSeq: Number(rows[0]?.next_seq) };
}

/** Whether some statement is waiting on a lock (the captured write is really in flight in PostgreSQL). */
async function writeIsWaiting(pool: pg.Pool): Promise<boolean> {
  const { rows } = await pool.query<{ n: string }>(
    `select count(*)::text as n from pg_stat_activity
      where datname = current_database() and wait_event_type = 'Lock' and query ilike '%update sessions set next_seq%'`,
  );
  return Number(rows[0]?.n) > 0;
}

describe("pauseForRestart: the restart checkpoint", () => {
  it("a finished tool result queued behind an in-flight journal write commits; the blocked model turn is not waited for; new work is refused (S004-137)", async () => {
    const r = overlappingRunner();
    const events: DelegationEvent[] = [];
    const { service, repo } = makeService(db.pool, { runner: r.runner, onEvent: (e) => events.push(e) });
    const { account, parent } = await newParent(service);
    const turn = service.prompt(parent.id, account.id, "work on t1 and t2");
    await r.stage1.promise;
    const lock = await lockSession(db.pool, parent.id);
    r.go.open();
    await r.stage2.promise;
    await waitFor(() => writeIsWaiting(db.pool), "the intent write to wait on the row lock");

    let resolved = false;
    const pause = service.pauseForRestart();
    void pause.then(() => {
      resolved = true;
    });
    // Still in flight: the checkpoint has not resolved, and nothing of stage 2 is in the journal yet.
    expect(await writeIsWaiting(db.pool)).toBe(true);
    expect(resolved).toBe(false);
    const before = messages(await repo.readJournal(parent.id, account.id));
    expect(before.some((m) => m.role === "toolResult")).toBe(false);

    await lock.client.query("commit");
    lock.client.release();
    await pause;
    // Resolved while the model turn is still blocked.
    expect(r.state.modelReturned).toBe(false);
    // The in-flight intent and the tool result queued behind it both committed, in the order reported.
    const journal = await repo.readJournal(parent.id, account.id);
    const kinds = journal.map((e) =>
      e.body.type === "message"
        ? e.body.message.role
        : `${e.body.type}:${"toolCallId" in e.body ? e.body.toolCallId : ""}`,
    );
    expect(kinds).toEqual(["user", "assistant", "tool_intent:t1", "tool_intent:t2", "toolResult"]);
    // Idempotent: the same checkpoint, already resolved.
    expect(service.pauseForRestart()).toBe(pause);
    await service.pauseForRestart();
    expect(events.filter((e) => e.type === "delegation.paused")).toEqual([
      { type: "delegation.paused", failures: 0 },
    ]);

    // A new Delegate (and any new prompt) is refused with a typed error; nothing is written for it.
    const refused = await service
      .delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: "after-pause",
        task: scriptTask({ answer: "never" }),
        mode: "background",
      })
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(DelegationError);
    expect(refused).toMatchObject({ code: "paused_for_restart" });
    await expect(service.prompt(parent.id, account.id, "more")).rejects.toMatchObject({
      code: "paused_for_restart",
    });
    const { rows } = await db.pool.query("select 1 from subagent_runs where parent_session_id = $1", [
      parent.id,
    ]);
    expect(rows).toHaveLength(0);

    // The model answers after the checkpoint: its write is refused (typed), the journal is unchanged.
    r.model.open();
    const outcome = await turn;
    expect(outcome.stopReason).toBe("error");
    expect(r.state.lateWrite).toMatchObject({ code: "paused_for_restart" });
    expect((await repo.readJournal(parent.id, account.id)).length).toBe(journal.length);
    await service.close();
  });

  it("a captured write that fails while the checkpoint drains makes it reject with a typed error", async () => {
    const r = overlappingRunner();
    const { service, repo } = makeService(db.pool, { runner: r.runner });
    const { account, parent } = await newParent(service);
    const turn = service.prompt(parent.id, account.id, "work on t1 and t2");
    await r.stage1.promise;
    const lock = await lockSession(db.pool, parent.id);
    r.go.open();
    await r.stage2.promise;
    await waitFor(() => writeIsWaiting(db.pool), "the intent write to wait on the row lock");
    const pause = service.pauseForRestart();
    pause.catch(() => {});
    // Another writer takes the sequence number the waiting append will read: its insert violates the key.
    await lock.client.query(
      `insert into journal_entries (session_id, seq, kind, role, body) values ($1, $2, 'message', 'user', $3)`,
      [parent.id, lock.nextSeq, JSON.stringify({ type: "message", message: { role: "user", content: "x" } })],
    );
    await lock.client.query("commit");
    lock.client.release();
    const error = await pause.catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RestartCheckpointError);
    expect(error).toMatchObject({ code: "checkpoint_failed" });
    expect((error as RestartCheckpointError).failures.length).toBeGreaterThan(0);
    expect((error as RestartCheckpointError).failures[0]).toMatchObject({ code: "conflict" });
    // The same rejection for every caller; the model turn was never waited for.
    await expect(service.pauseForRestart()).rejects.toBe(error);
    expect(r.state.modelReturned).toBe(false);
    // Nothing already recorded is lost.
    const kinds = messages(await repo.readJournal(parent.id, account.id)).map((m) => m.role);
    expect(kinds.slice(0, 2)).toEqual(["user", "assistant"]);
    r.model.open();
    await turn;
    await service.close();
  });

  it("a background call's turn is left open for boot recovery; its progress publication drains (S004-137)", async () => {
    const published: number[] = [];
    const model = latch();
    const inTurn = latch();
    const runner: SessionTurnRunner = {
      async runTurn(request, host) {
        if (request.context.at(-1)?.role === "user" && request.scope) {
          host.progress({ type: "text", sessionId: request.sessionId, text: "working" });
          inTurn.open();
          await Promise.race([model.promise, new Promise((r) => setTimeout(r, 15_000))]);
          try {
            await host.record({
              role: "assistant",
              content: [{ type: "text", text: "done" }],
              stopReason: "stop",
            });
          } catch (e) {
            return { stopReason: "error", errorMessage: (e as Error).message };
          }
        }
        return { stopReason: "stop" };
      },
    };
    const slow = latch();
    const { service, repo } = makeService(db.pool, {
      runner,
      publishProgress: async (snapshot) => {
        await slow.promise;
        published.push(snapshot.seq);
      },
    });
    const { account, parent } = await newParent(service);
    const receipt = await delegateBackground(service, { parent, account }, "bg", "do it");
    if (receipt.kind !== "started") throw new Error("expected a started call");
    await inTurn.promise;
    let resolved = false;
    const pause = service.pauseForRestart().then(() => {
      resolved = true;
    });
    await new Promise((r) => setImmediate(r));
    // The progress publication is in flight: the checkpoint waits for it, not for the model.
    expect(resolved).toBe(false);
    slow.open();
    await pause;
    expect(published).toEqual([1]);
    model.open();
    await service.whenIdle();
    // The call was neither settled nor failed: its row stays open (owned by this process) for recovery.
    const run = await repo.getRun(receipt.runId, account.id);
    expect(run.status).toBe("running");
    expect(await repo.resultForRun(receipt.runId, account.id)).toBeNull();
    await service.close();
  });
});
