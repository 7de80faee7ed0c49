import type { JournalWrite } from "@crw/db";
import { journalRows } from "@crw/tools/delegation";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { recoverDelegations } from "../../src/index.js";
import { makeService, messages, newParent, scriptTask, waitFor } from "./helpers.js";

/**
 * Which cut turns a boot charges, over real PostgreSQL: only a tool's own answer that says its outcome is
 * unknown makes the continuation a charged one. A turn whose tool calls all answered was waiting on its
 * model, and going on repeats no effect.
 */
const db = useTestDatabase();

type Service = ReturnType<typeof makeService>["service"];

const UNKNOWN_OUTCOME =
  "interrupted: this call may or may not have taken effect before a restart; its outcome is unknown. " +
  "Verify its effect before repeating it.";

/** A delegated call of a fresh root parent whose child a dead process had started. */
async function startedDelegation(service: Service, task: string) {
  const { account, parent } = await newParent(service);
  const d = await service.repo.createDelegation({
    parentSessionId: parent.id,
    principalAccountId: account.id,
    toolCallId: "t1",
    task,
    mode: "background",
    model: "scripted",
    scope: JSON.stringify({ accountId: account.id, target: { kind: "host", ref: null } }),
  });
  await service.repo.startRun(d.run.id, d.run.generation, "dead-owner");
  return { account, parent, run: d.run, child: d.child.id };
}

/** A turn that asked for one tool call, recorded its intent, and got the tool's answer. */
function answeredCall(id: string, name: string, answer: string): JournalWrite[] {
  return [
    {
      body: {
        type: "message",
        message: {
          role: "assistant",
          content: [{ type: "toolCall", id, name, arguments: {} }],
          stopReason: "toolUse",
        },
      },
    },
    { body: { type: "tool_intent", toolCallId: id, toolName: name, arguments: {} } },
    {
      body: {
        type: "message",
        message: { role: "toolResult", toolCallId: id, toolName: name, content: answer, isError: false },
      },
    },
  ];
}

const runRow = async (id: string) =>
  (
    await db.pool.query(
      "select status, recovery_attempts, free_continuations from subagent_runs where id = $1",
      [id],
    )
  ).rows[0];

async function recoveredOnce(service: Service, d: Awaited<ReturnType<typeof startedDelegation>>) {
  const report = await recoverDelegations(service);
  expect(report.continued).toEqual([d.run.id]);
  expect(report.unknownToolCalls).toBe(0);
  await waitFor(
    async () => (await service.repo.queuedResultIds(d.parent.id, d.account.id)).length === 0,
    "the parent's delivery",
  );
  await service.whenIdle();
}

describe("a cut turn whose tool calls all answered", () => {
  it("continues free: a known tool answer after an intent row costs no recovery attempt", async () => {
    const { service, repo } = makeService(db.pool);
    const script = scriptTask({ answer: "went on" });
    const d = await startedDelegation(service, script);
    await repo.append(d.child, d.account.id, [
      journalRows.user(script),
      ...answeredCall("c-1", "Work", "the work is done"),
    ]);
    await recoveredOnce(service, d);
    expect(await runRow(d.run.id)).toMatchObject({
      status: "succeeded",
      recovery_attempts: 0,
      free_continuations: 1,
    });
    const msgs = messages(await repo.readJournal(d.child, d.account.id));
    // the answered call was left as it was: no unknown-outcome answer was written for it
    expect(msgs.filter((m) => m.role === "toolResult")).toHaveLength(1);
    expect(msgs.some((m) => m.role === "custom" && m.customType === "interrupted")).toBe(true);
    await service.close();
  });

  it("continues free when a later user message quotes the unknown-outcome text: only a tool's answer counts", async () => {
    const { service, repo } = makeService(db.pool);
    const script = scriptTask({ answer: "went on" });
    const d = await startedDelegation(service, script);
    await repo.append(d.child, d.account.id, [
      journalRows.user(script),
      ...answeredCall("c-1", "Work", "the work is done"),
      journalRows.user(`${UNKNOWN_OUTCOME} (quoted by the user)`),
    ]);
    await recoveredOnce(service, d);
    expect(await runRow(d.run.id)).toMatchObject({
      status: "succeeded",
      recovery_attempts: 0,
      free_continuations: 1,
    });
    await service.close();
  });
});
