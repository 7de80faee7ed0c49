import { randomUUID } from "node:crypto";
import type { DelegationRepository, JournalWrite } from "@crw/db";
import { journalRows } from "@crw/tools/delegation";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { endsWithAnswer, recoverDelegations } from "../../src/index.js";
import { askForFork, makeService, newParent } from "./helpers.js";

const db = useTestDatabase();
const { user, answer, asking, intent, result } = journalRows;
const history = (turns: number): JournalWrite[] =>
  Array.from({ length: turns }, (_, i) => [user(`q${i}`), answer(`a${i}`)]).flat();

/** The repository with every whole-journal read recorded: session and the seq it read from. */
function recordingReads(repo: DelegationRepository) {
  const reads: Array<{ sessionId: string; fromSeq: number }> = [];
  const recording = Object.create(repo) as DelegationRepository;
  recording.readJournal = (s, p, o) => {
    reads.push({ sessionId: s, fromSeq: o?.fromSeq ?? 1 });
    return repo.readJournal(s, p, o);
  };
  // a tail read starts where the rows it returns start
  recording.readJournalTail = async (s, p) => {
    const rows = await repo.readJournalTail(s, p);
    reads.push({ sessionId: s, fromSeq: rows[0]?.seq ?? 1 });
    return rows;
  };
  recording.journalTailWithWork = async (s, p) => {
    const out = await (repo.journalTailWithWork?.(s, p) ?? Promise.reject(new Error("no combined read")));
    reads.push({ sessionId: s, fromSeq: out.tail[0]?.seq ?? 1 });
    return out;
  };
  recording.journalTailsWithWork = async (sessions) => {
    const out = await repo.journalTailsWithWork(sessions);
    for (const { sessionId } of sessions)
      reads.push({ sessionId, fromSeq: out.get(sessionId)?.tail[0]?.seq ?? 1 });
    return out;
  };
  return { repo: recording, reads };
}

describe("reading only the newest turn of a journal", () => {
  it("the tail from the newest answer tells what the whole journal tells: answered or not, empty or not", async () => {
    const { service, repo } = makeService(db.pool);
    const cases: JournalWrite[][] = [
      [],
      [user("only a task")],
      [...history(50)],
      [...history(50), user("a steer after the answer")],
      [...history(50), asking("c1"), intent("c1")],
      [...history(50), asking("c1"), intent("c1"), result("c1")],
    ];
    for (const rows of cases) {
      const account = await repo.createAccount({ name: `tail-${randomUUID().slice(0, 8)}` });
      const session = await repo.createRootSession(account.id, "scripted");
      if (rows.length > 0) await repo.append(session.id, account.id, rows);
      const whole = await repo.readJournal(session.id, account.id);
      const tail = await repo.readJournalTail(session.id, account.id);
      expect(tail).toEqual(whole.slice(whole.length - tail.length));
      expect(endsWithAnswer(tail)).toBe(endsWithAnswer(whole));
      expect(tail.length === 0).toBe(whole.length === 0);
      expect(tail.length).toBeLessThanOrEqual(4);
      // another account's session is not found, as with a whole read
      const other = await repo.createAccount({ name: `tail-other-${randomUUID().slice(0, 8)}` });
      await expect(repo.readJournalTail(session.id, other.id)).rejects.toMatchObject({ code: "not_found" });
    }
    await service.close();
  });

  it("boot recovery and the settlement after it read an answered child's journal from its newest answer on", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const { run, child } = await repo.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "t1",
      task: "finished before the crash",
      mode: "background",
      model: "scripted",
      scope: JSON.stringify({ accountId: account.id, target: { kind: "host", ref: null } }),
    });
    await repo.startRun(run.id, run.generation, "dead-owner");
    await repo.append(child.id, account.id, [...history(100), answer("all done")]);
    const { repo: recording, reads } = recordingReads(repo);
    const recovering = makeService(db.pool, { repo: recording });
    const report = await recoverDelegations(recovering.service);
    expect(report.settledWithoutTurn).toContain(run.id);
    await recovering.service.whenIdle();
    expect(await repo.getRun(run.id, account.id)).toMatchObject({ status: "succeeded" });
    // Recovery's look and the settlement's (the run goes on without a new turn): the task is seq 1 and
    // "all done", the newest answer, seq 202.
    const childReads = reads.filter((r) => r.sessionId === child.id);
    expect(childReads.length).toBeGreaterThanOrEqual(2);
    expect(childReads.every((r) => r.fromSeq === 202)).toBe(true);
    await recovering.service.close();
    await service.close();
  });

  it("a fork copies its parent's context up to the message that asked for it without reading the parent's journal", async () => {
    const { repo: real } = makeService(db.pool);
    const { repo, reads } = recordingReads(real);
    const { service } = makeService(db.pool, { repo });
    const { account, parent } = await newParent(service);
    await repo.append(parent.id, account.id, history(200));
    await askForFork(service, { parent, account });
    await service.whenIdle();
    const parentJournal = await real.readJournal(parent.id, account.id);
    const asked = parentJournal.find(
      (e) => e.body.type === "message" && e.body.message.role === "assistant" && e.seq > 400,
    );
    if (!asked) throw new Error("the parent never asked for the fork");
    const [childRow] = await real.childrenOf(parent.id, account.id, 10);
    if (!childRow) throw new Error("no fork child");
    const childJournal = await real.readJournal(childRow.child.id, account.id);
    expect(childJournal.slice(0, asked.seq - 1).map((e) => e.body)).toEqual(
      parentJournal.slice(0, asked.seq - 1).map((e) => e.body),
    );
    expect(childJournal[asked.seq - 1]?.body).not.toEqual(asked.body);
    expect(reads.filter((r) => r.sessionId === parent.id)).toEqual([]);
    await service.close();
  });
});
