import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import type { SubagentRun } from "../src/index.js";
import { family } from "./support/family.js";

const db = useTestDatabase();

const settlement = (run: SubagentRun, dropSteers?: string) => ({
  runId: run.id,
  generation: run.generation,
  resultId: randomUUID(),
  outcome: "ok" as const,
  body: "done",
  byteSize: 4,
  ...(dropSteers !== undefined && { dropSteers }),
});

const steersOf = async (childSessionId: string) =>
  (
    await db.pool.query<{ text: string; status: string; drop_reason: string | null }>(
      "select text, status, drop_reason from delegated_steers where child_session_id = $1 order by created_at, id",
      [childSessionId],
    )
  ).rows;

describe("a settlement that drops the child's pending follow-ups", () => {
  it("drops them with its reason in the same statement that settles the run", async () => {
    const { r, account, runs } = await family(db.pool, 2, "ds");
    const [run, other] = runs as [SubagentRun, SubagentRun];
    const child = run.childSessionId as string;
    await r.enqueueSteer(child, account.id, "one more thing");
    await r.enqueueSteer(other.childSessionId as string, account.id, "for the other call");
    const settled = await r.settleRun(settlement(run, "the call settled before this follow-up was taken"));
    expect(settled.settled).toBe(true);
    expect(await steersOf(child)).toEqual([
      {
        text: "one more thing",
        status: "dropped",
        drop_reason: "the call settled before this follow-up was taken",
      },
    ]);
    // another child's follow-up is not this settlement's
    expect((await steersOf(other.childSessionId as string)).map((s) => s.status)).toEqual(["pending"]);
  });

  it("drops nothing when it does not settle (the run already has its result) or was not asked to", async () => {
    const { r, account, runs } = await family(db.pool, 2, "dn");
    const [run, plain] = runs as [SubagentRun, SubagentRun];
    const child = run.childSessionId as string;
    expect((await r.settleRun(settlement(run))).settled).toBe(true);
    await r.enqueueSteer(child, account.id, "after the result");
    // a second settlement of the same run finds the first result: the later follow-up stays pending
    const again = await r.settleRun(settlement(run, "dropped by a settlement that did not settle"));
    expect(again.settled).toBe(false);
    expect((await steersOf(child)).map((s) => s.status)).toEqual(["pending"]);
    // without a reason the settlement leaves the child's follow-ups alone
    await r.enqueueSteer(plain.childSessionId as string, account.id, "kept");
    expect((await r.settleRun(settlement(plain))).settled).toBe(true);
    expect((await steersOf(plain.childSessionId as string)).map((s) => s.status)).toEqual(["pending"]);
  });
});
