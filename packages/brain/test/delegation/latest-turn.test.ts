import type { DelegationRepository, JournalWrite } from "@crw/db";
import { journalRows } from "@crw/tools/delegation";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { recoverDelegations } from "../../src/index.js";
import { delegateForeground, makeService, newParent, scriptTask, waitFor } from "./helpers.js";

const db = useTestDatabase();

const { user, answer, asking, intent, result } = journalRows;
const steer = (content: string): JournalWrite => ({
  body: { type: "message", message: { role: "custom", customType: "steer", content } },
});

const texts = (entries: Awaited<ReturnType<DelegationRepository["latestTurn"]>>) =>
  entries.map((e) =>
    e.body.type === "message"
      ? `${e.body.message.role}${e.settled ? "" : "?"}`
      : `${e.body.type}${e.settled ? "" : "?"}`,
  );

describe("getLatestTurn", () => {
  it("the newest turn's rows, provisional rows and custom events included; a finished turn back to the answer before it (S004-181)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    await repo.append(parent.id, account.id, [
      user("one"),
      answer("a1"),
      user("two"),
      asking("t1"),
      intent("t1"),
      result("t1"),
      answer("a2"),
    ]);
    // Finished: the turn that a2 ended, from after a1.
    expect(texts(await repo.latestTurn(parent.id, account.id))).toEqual([
      "user",
      "assistant",
      "tool_intent",
      "toolResult",
      "assistant",
    ]);
    // Interrupted: the rows after a2, a custom event and provisional rows included.
    await repo.append(parent.id, account.id, [user("three"), steer("also this"), asking("t2")]);
    await repo.append(parent.id, account.id, [{ ...intent("t2"), settled: false }]);
    expect(texts(await repo.latestTurn(parent.id, account.id))).toEqual([
      "user",
      "custom",
      "assistant",
      "tool_intent?",
    ]);
    await service.close();
  });

  it("boot recovery settles an interrupted tail from the newest turn only, never reading the whole journal (S004-181)", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const history: JournalWrite[] = [];
    for (let i = 0; i < 200; i++) history.push(user(`q${i}`), answer(`a${i}`));
    await repo.append(parent.id, account.id, [...history, user("last"), asking("t9"), intent("t9")]);
    const reads: string[] = [];
    const counting = Object.create(repo) as DelegationRepository;
    counting.readJournal = (s, p, o) => {
      reads.push(`readJournal ${s}`);
      return repo.readJournal(s, p, o);
    };
    counting.latestTurn = async (s, p) => {
      const rows = await repo.latestTurn(s, p);
      reads.push(`latestTurn ${s} ${rows.length}`);
      return rows;
    };
    const recovering = makeService(db.pool, { repo: counting });
    const report = await recoverDelegations(recovering.service);
    await recovering.service.close();
    expect(report.unknownToolCalls).toBeGreaterThanOrEqual(1);
    const mine = reads.filter((r) => r.includes(parent.id));
    expect(mine).toEqual([`latestTurn ${parent.id} 3`]);
    const tail = texts(await repo.latestTurn(parent.id, account.id));
    expect(tail).toEqual(["user", "assistant", "tool_intent", "toolResult"]);
    await service.close();
  });

  it("the dream error check reads the dream's newest turn", async () => {
    const { service } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    await service.prompt(parent.id, account.id, "something to dream about");
    const ok = await service.startDream({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      dreamRunId: "ok-dream",
      task: scriptTask({ answer: "dreamt" }),
    });
    const bad = await service.startDream({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      dreamRunId: "bad-dream",
      task: scriptTask({ answer: "never", failAtRequest: 0 }),
    });
    if (ok.kind !== "started" || bad.kind !== "started") throw new Error("expected background dreams");
    await waitFor(
      async () => (await service.repo.settledResultIds(parent.id, account.id)).length === 2,
      "both",
    );
    await service.whenIdle();
    expect(await service.dreamTurnCheck(ok.childSessionId, account.id)).toEqual({ kind: "ok" });
    expect(await service.dreamTurnCheck(bad.childSessionId, account.id)).toEqual({
      kind: "failed",
      reason: "scripted provider failure",
      interrupted: false,
    });
    // Ordinary children are not dreams.
    const plain = await delegateForeground(
      service,
      { parent, account },
      "plain",
      scriptTask({ answer: "plain" }),
    );
    if (plain.kind !== "result") throw new Error("expected a result");
    await expect(service.dreamTurnCheck(plain.childSessionId, account.id)).rejects.toMatchObject({
      code: "invalid_input",
    });
    await service.close();
  });
});
