import type { JournalWrite } from "@crw/db";
import { journalRows } from "@crw/tools/delegation";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { recoverDelegations } from "../../src/index.js";
import { messages, newParent, observeReads, scriptTask, waitFor } from "./helpers.js";

/**
 * A recovered call's first turn and its journal: boot recovery reads a short journal whole with its tail,
 * and the call's start appends the row the turn answers; the turn folds both instead of reading the journal.
 */
const db = useTestDatabase();

/** A turn that asked for one tool call, recorded its intent and got its answer: it continues free. */
const answeredCall: JournalWrite[] = [
  {
    body: {
      type: "message",
      message: {
        role: "assistant",
        content: [{ type: "toolCall", id: "c-1", name: "Work", arguments: {} }],
        stopReason: "toolUse",
      },
    },
  },
  { body: { type: "tool_intent", toolCallId: "c-1", toolName: "Work", arguments: {} } },
  {
    body: {
      type: "message",
      message: { role: "toolResult", toolCallId: "c-1", toolName: "Work", content: "done", isError: false },
    },
  },
];

/** A call a dead process had started, whose child's journal holds `rows` after its task. */
async function interrupted(made: ReturnType<typeof observeReads>, rows: JournalWrite[]) {
  const { account, parent } = await newParent(made.service);
  const task = scriptTask({ answer: "went on" });
  const { run, child } = await made.repo.createDelegation({
    parentSessionId: parent.id,
    principalAccountId: account.id,
    toolCallId: "t1",
    task,
    mode: "background",
    model: "scripted",
    scope: JSON.stringify({ accountId: account.id, target: { kind: "host", ref: null } }),
  });
  // the dead process's start journaled the task
  await made.repo.startRun(run.id, run.generation, "dead-owner");
  await made.repo.append(child.id, account.id, rows);
  made.watched.add(child.id);
  return { account, parent, run, child: child.id };
}

async function recovered(made: ReturnType<typeof observeReads>, d: Awaited<ReturnType<typeof interrupted>>) {
  const report = await recoverDelegations(made.service);
  expect(report.continued).toEqual([d.run.id]);
  await waitFor(
    async () => (await made.repo.queuedResultIds(d.parent.id, d.account.id)).length === 0,
    "the parent's delivery",
  );
  await made.service.whenIdle();
  return messages(await made.repo.readJournal(d.child, d.account.id));
}

describe("a recovered call's first turn folds the journal recovery read", () => {
  it("reads no journal before its turn, whose context is the journal read at boot and the interrupted context", async () => {
    const made = observeReads(db.pool);
    const d = await interrupted(made, answeredCall);
    const msgs = await recovered(made, d);
    expect(made.events).toEqual(["turn(user,assistant,toolResult,custom)"]);
    expect(msgs.map((m) => m.role)).toEqual(["user", "assistant", "toolResult", "custom", "assistant"]);
    await made.service.close();
  });

  it("a journal longer than the rows read whole at boot is read by the turn", async () => {
    const made = observeReads(db.pool);
    // the task, 61 notes and the answered call: 65 rows, one more than a boot read takes whole
    const many = Array.from({ length: 61 }, (_, i) => journalRows.user(`note ${i}`));
    const d = await interrupted(made, [...many, ...answeredCall]);
    await recovered(made, d);
    expect(made.events[0]).toBe("read(0)");
    expect(made.events[1]).toMatch(/^turn\(user(,user){61},assistant,toolResult,custom\)$/);
    await made.service.close();
  });

  it("a row written between recovery's read and the call's start makes the turn read the journal, that row included", async () => {
    const made = observeReads(db.pool);
    const d = await interrupted(made, answeredCall);
    const start = made.repo.startRun.bind(made.repo);
    made.repo.startRun = async (...args) => {
      await made.repo.append(d.child, d.account.id, [journalRows.user("written meanwhile")]);
      return start(...args);
    };
    await recovered(made, d);
    expect(made.events).toEqual(["read(0)", "turn(user,assistant,toolResult,user,custom)"]);
    await made.service.close();
  });
});
