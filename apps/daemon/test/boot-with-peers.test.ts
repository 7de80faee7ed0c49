import { randomUUID } from "node:crypto";
import { captureDelegatedExecutionScope } from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import { journalRows } from "@crw/tools/delegation";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { pino } from "pino";
import { expect, it } from "vitest";
import { loadConfig, startDaemon } from "../src/index.js";
import { steps } from "./support/client.js";
import { waitFor } from "./support/wait.js";

/**
 * A daemon that boots while another daemon of the database is live recovers only dead owners' work: the
 * live one's journals (a tool call in flight), its runs and the runs it made but has not leased yet stay
 * as they are. When the live one dies, the booted daemon's sweep takes its work.
 */
const db = useTestDatabase();

const { asking, intent } = journalRows;

const toolResults = async (repo: PgDelegationRepository, sessionId: string, accountId: string) =>
  (await repo.readJournal(sessionId, accountId)).filter(
    (e) => e.body.type === "message" && e.body.message.role === "toolResult",
  );

it("a daemon booting beside a live one takes only dead owners' work, and the live one's once it dies", async () => {
  const repo = new PgDelegationRepository(db.pool);
  const account = await repo.createAccount({ name: `peers-${Date.now()}` });
  const scope = captureDelegatedExecutionScope({
    accountId: account.id,
    target: { kind: "host", ref: null },
  });
  const livesOn = await repo.createRootSession(account.id, "scripted");
  const diedWith = await repo.createRootSession(account.id, "scripted");
  const delegate = async (parentSessionId: string, i: number) =>
    (
      await repo.createDelegation({
        parentSessionId,
        principalAccountId: account.id,
        toolCallId: `peer-${i}`,
        task: steps({ text: `child ${i} done` }),
        mode: "background",
        model: "scripted",
        scope,
      })
    ).run;
  // the live peer: a child in a tool call, its root in a tool call of its own, a run made but not leased
  const liveOwner = `live-${randomUUID()}`;
  const releaseLive = await repo.holdOwnerLease(liveOwner);
  const live = await delegate(livesOn.id, 1);
  await repo.startRun(live.id, live.generation, liveOwner);
  await repo.append(live.childSessionId ?? "", account.id, [asking("t1"), intent("t1")]);
  await repo.append(livesOn.id, account.id, [asking("r1"), intent("r1")]);
  const unleased = await delegate(livesOn.id, 2);
  // a daemon that died
  const dead = await delegate(diedWith.id, 3);
  await repo.startRun(dead.id, dead.generation, `dead-${randomUUID()}`);

  const daemon = await startDaemon(
    loadConfig({
      env: { DATABASE_URL: db.url },
      overrides: {
        dataDir: scratchDir("crw-daemon-peers-"),
        port: 0,
        runtime: { maxRunners: 1, turnsPerRunner: 8 },
      },
    }),
    { log: pino({ level: "silent" }) },
  );
  try {
    const boot = daemon.runtime.health().recovery;
    expect(boot?.delegations?.continued).toEqual([dead.id]);
    expect(boot?.delegations?.unknownToolCalls).toBe(0);
    await waitFor(
      async () => (await repo.getRun(dead.id, account.id)).status === "succeeded",
      "the dead run",
    );
    // the live peer's work is as it left it
    expect(await repo.getRun(live.id, account.id)).toMatchObject({ status: "running", recoveryAttempts: 0 });
    expect(
      (await db.pool.query("select locked_by from subagent_runs where id = $1", [live.id])).rows[0],
    ).toEqual({
      locked_by: liveOwner,
    });
    expect(await toolResults(repo, live.childSessionId ?? "", account.id)).toEqual([]);
    expect(await toolResults(repo, livesOn.id, account.id)).toEqual([]);
    expect(await repo.getRun(unleased.id, account.id)).toMatchObject({ status: "queued" });

    // the live peer dies: its run is taken, its tool call of unknown outcome answered, one attempt charged
    await releaseLive();
    await waitFor(
      async () => (await repo.getRun(live.id, account.id)).status === "succeeded",
      "the live run",
      20_000,
    );
    const answered = await toolResults(repo, live.childSessionId ?? "", account.id);
    expect(answered).toHaveLength(1);
    expect(JSON.stringify(answered[0])).toMatch(/outcome is unknown/);
    expect(await repo.getRun(live.id, account.id)).toMatchObject({ recoveryAttempts: 1 });
  } finally {
    await daemon.stop();
  }
}, 60_000);
