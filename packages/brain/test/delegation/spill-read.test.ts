import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import {
  lastSettledAssistantText,
  latestAssistantText,
  readSubagent,
} from "../../src/delegation/readSubagent.js";
import { ASSISTANT_PAGE, FileSpillStore, type SpillStore } from "../../src/index.js";
import {
  continueForeground,
  delegateBackground,
  delegateForeground,
  makeService,
  messages,
  newParent,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

/** `repo` with each read of assistant rows reporting its page size to `pages` before it runs. */
function pageCounting(repo: ReturnType<typeof makeService>["repo"], pages: number[]) {
  const counting = Object.create(repo) as typeof repo;
  counting.recentAssistantMessages = (s, p, l, b) => {
    pages.push(l);
    return repo.recentAssistantMessages(s, p, l, b);
  };
  return counting;
}

async function backgroundResult(service: ReturnType<typeof makeService>["service"], answer: string) {
  const { account, parent } = await newParent(service);
  const receipt = await delegateBackground(service, { parent, account }, "bg", scriptTask({ answer }));
  if (receipt.kind !== "started") throw new Error("expected background");
  await waitFor(
    async () => (await service.repo.settledResultIds(parent.id, account.id)).length === 1,
    "delivered",
  );
  await service.whenIdle();
  const msgs = messages(await service.repo.readJournal(parent.id, account.id));
  const delivered = msgs.find((m) => m.role === "custom");
  if (delivered?.role !== "custom") throw new Error("no delivery");
  return { account, parent, delivered, child: receipt.childSessionId };
}

describe("spilled results", () => {
  it("spilling does not acknowledge delivery: the result waits in the inbox until the parent's journal commit (S004-242)", async () => {
    const handedOff: string[] = [];
    const { service, repo } = makeService(db.pool, {
      toolResultInlineBytes: () => 16,
      onEvent: (e) => {
        if (e.type === "delegation.result_steered") handedOff.push(e.resultId);
      },
    });
    const { account, parent } = await newParent(service);
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    const busy = service.turns.exclusive(parent.id, () => held);
    await delegateBackground(
      service,
      { parent, account },
      "bg",
      scriptTask({ answer: "a result well above sixteen bytes" }),
    );
    // The settlement's last step (the inbox handoff) is over: nothing of the spill's preparation is pending.
    await waitFor(async () => handedOff.length === 1, "the result handed to the busy parent");
    const [queued] = await repo.queuedResults(parent.id, account.id);
    expect(queued?.id).toBe(handedOff[0]);
    expect(queued?.spillPath).toBeTruthy();
    expect(readFileSync(queued?.spillPath ?? "", "utf8")).toBe("a result well above sixteen bytes");
    expect(await repo.settledResultIds(parent.id, account.id)).toEqual([]);
    release();
    await busy;
    // The next result entering the idle parent's inbox starts its follow-up, which commits both.
    await delegateBackground(service, { parent, account }, "bg-2", scriptTask({ answer: "ok" }));
    await waitFor(async () => (await repo.settledResultIds(parent.id, account.id)).length === 2, "delivered");
    await service.whenIdle();
  });

  it("a body of exactly the limit (UTF-8 bytes) stays inline (S004-237)", async () => {
    const body = "é".repeat(50); // 100 bytes, 50 characters
    const { service } = makeService(db.pool, { toolResultInlineBytes: () => 100 });
    const { delivered } = await backgroundResult(service, body);
    expect(delivered.details?.spillPath).toBeUndefined();
    expect(delivered.content.endsWith(`\n${body}`)).toBe(true);
  });

  it("a failed spill write is an explicit error result with a DelegateRead hint, never a truncated success (S004-241)", async () => {
    const broken: SpillStore = {
      write: async () => {
        throw new Error("disk full");
      },
    };
    const { service } = makeService(db.pool, { toolResultInlineBytes: () => 10, spill: broken });
    const { delivered, child } = await backgroundResult(service, "a result longer than ten bytes");
    expect(delivered.details?.outcome).toBe("error");
    expect(delivered.content).toContain("disk full");
    expect(delivered.content).toContain(`DelegateRead on child ${child}`);
    expect(delivered.content).not.toContain("a result"); // not even the part that fits the limit
  });
});

describe("readSubagent", () => {
  it("the ownership guard runs before the read: a stranger's request reads no answer row (S004-178)", async () => {
    const base = makeService(db.pool);
    const calls: string[] = [];
    const watching = Object.create(base.repo) as typeof base.repo;
    watching.getChildSession = async (...args) => {
      const child = await base.repo.getChildSession(...args);
      calls.push("guarded");
      return child;
    };
    watching.recentAssistantMessages = (...args) => {
      calls.push("read");
      return base.repo.recentAssistantMessages(...args);
    };
    const { service } = makeService(db.pool, { repo: watching });
    const { account, parent } = await newParent(service);
    const stranger = await service.repo.createAccount({ name: `s-${randomUUID()}` });
    const r = await delegateForeground(service, { parent, account }, "d", scriptTask({ answer: "secret" }));
    if (r.kind !== "result") throw new Error("expected a result");
    calls.length = 0;
    await expect(service.readSubagent(parent.id, r.childSessionId, stranger.id)).rejects.toMatchObject({
      code: "not_found",
    });
    expect(calls).toEqual([]);
    await expect(service.readSubagent(parent.id, r.childSessionId, account.id)).resolves.toBe("secret");
    expect(calls).toEqual(["guarded", "read"]);
  });
});

describe("the ordinary last-row reply reader", () => {
  it("a call's result reads one assistant row; an empty last answer never surfaces an older call's reply", async () => {
    const base = makeService(db.pool);
    const limits: number[] = [];
    const counting = pageCounting(base.repo, limits);
    // a settlement reads its reply with its settling mark: the newest assistant row alone
    let settlingReads = 0;
    counting.markSettlingWithReply = (...args) => {
      settlingReads++;
      return base.repo.markSettlingWithReply(...args);
    };
    const { service } = makeService(db.pool, { repo: counting });
    const { account, parent } = await newParent(service);
    const first = await delegateForeground(
      service,
      { parent, account },
      "d",
      scriptTask({ answer: "the first answer" }),
    );
    if (first.kind !== "result") throw new Error("expected a result");
    expect(first.body).toBe("the first answer");
    const empty = await continueForeground(
      service,
      { parent, account },
      first.childSessionId,
      "c",
      scriptTask({ answer: "" }),
    );
    expect(empty).toMatchObject({ kind: "result", body: "(the child gave no answer)" });
    // Settlement read one row per call (with its mark); only DelegateRead pages (and finds the older answer).
    expect(settlingReads).toBe(2);
    expect(limits.every((l) => l === 1)).toBe(true);
    limits.length = 0;
    expect(await service.readSubagent(parent.id, first.childSessionId, account.id)).toBe("the first answer");
    expect(limits).toEqual([ASSISTANT_PAGE]);
    await service.close();
  });
});

/** A background result of 3 KB against an inline limit of 200 bytes, delivered to an idle parent. */
describe("an above-limit result", () => {
  const limit = 200;
  const body = `héllo ${"x".repeat(3000)} end`;
  const size = Buffer.byteLength(body);
  let delivered: Awaited<ReturnType<typeof backgroundResult>>["delivered"];
  let inbox: { body: string } | undefined;
  beforeAll(async () => {
    const { service } = makeService(db.pool, { toolResultInlineBytes: () => limit });
    const r = await backgroundResult(service, body);
    delivered = r.delivered;
    const row = await db.pool.query<{ body: string }>(
      "select body from delegation_results where parent_session_id = $1",
      [r.parent.id],
    );
    inbox = row.rows[0];
  });

  it("is measured in UTF-8 bytes: a body under the limit in characters but over it in bytes is spilled through the recipient's writer (S004-236)", async () => {
    const writerRoot = mkdtempSync(join(tmpdir(), "crw-writer-"));
    const { service } = makeService(db.pool, {
      toolResultInlineBytes: () => 100,
      captureOutputWriter: async () => new FileSpillStore(writerRoot),
    });
    const wide = "é".repeat(60); // 60 characters, 120 bytes
    const r = await backgroundResult(service, wide);
    // Both the writer's capture and the spill itself went by bytes: the file is in the recipient's store.
    expect(r.delivered.details?.spillPath?.startsWith(writerRoot)).toBe(true);
    expect(r.delivered.details?.byteSize).toBe(120);
    rmSync(writerRoot, { recursive: true, force: true });
  });

  it("is spilled to the spill store and recorded there (S004-237)", async () => {
    const path = delivered.details?.spillPath ?? "";
    expect(path).not.toBe("");
    const spill = await db.pool.query("select byte_size from spilled_outputs where path = $1", [path]);
    expect(Number(spill.rows[0]?.byte_size)).toBe(size);
  });

  it("is stored complete: every byte of the body is in the spill file (S004-238)", () => {
    expect(readFileSync(delivered.details?.spillPath ?? "", "utf8")).toBe(body);
    expect(delivered.details?.byteSize).toBe(size);
  });

  it("reaches the inbox and the parent's journal as a bounded placeholder: the spill path, the size and a preview (S004-239)", () => {
    for (const content of [delivered.content, inbox?.body ?? ""]) {
      expect(content).toContain(delivered.details?.spillPath ?? "no path");
      expect(content).toContain(`${size} bytes`);
      expect(content).toContain("héllo xxx");
      expect(Buffer.byteLength(content)).toBeLessThan(size);
    }
  });
});

/** `n` journal rows of failed continuations that answered only whitespace. */
function emptyFailedAnswers(n: number) {
  return Array.from({ length: n }, () => ({
    body: {
      type: "message" as const,
      message: {
        role: "assistant" as const,
        content: [{ type: "text" as const, text: "  " }],
        stopReason: "error" as const,
      },
    },
  }));
}

/** A child's answer with whitespace of its own, followed by more empty failed continuations than two pages. */
describe("readSubagent after empty failed continuations", () => {
  let ctx: { repo: ReturnType<typeof makeService>["repo"]; parent: string; child: string; account: string };
  let answer: string | undefined;
  const reads: number[] = [];
  beforeAll(async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const first = await delegateForeground(
      service,
      { parent, account },
      "d",
      scriptTask({ answer: "\n  the answer  \n" }),
    );
    if (first.kind !== "result") throw new Error("expected a result");
    await repo.append(first.childSessionId, account.id, emptyFailedAnswers(ASSISTANT_PAGE * 2 + 5));
    ctx = { repo, parent: parent.id, child: first.childSessionId, account: account.id };
    answer = await readSubagent(pageCounting(repo, reads), parent.id, first.childSessionId, account.id);
  });

  it("gives what the canonical settled-answer reader gives, not the newest row's text (S004-175)", async () => {
    expect(answer).toBe(await lastSettledAssistantText(ctx.repo, ctx.child, ctx.account));
    expect(await latestAssistantText(ctx.repo, ctx.child, ctx.account)).toBeUndefined();
  });

  it("reads assistant rows newest-first in pages of 32 until an answer, or until the rows run out (S004-176)", async () => {
    expect(reads).toEqual([32, 32, 32]);
    // A child that never answered: one empty answer and 32 empty failed continuations, 33 rows. The second
    // page comes back short, so the reader stops there: no answer, no third read.
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const mute = await delegateForeground(service, { parent, account }, "m", scriptTask({ answer: "" }));
    if (mute.kind !== "result") throw new Error("expected a result");
    await repo.append(mute.childSessionId, account.id, emptyFailedAnswers(ASSISTANT_PAGE));
    const pages: number[] = [];
    expect(
      await readSubagent(pageCounting(repo, pages), parent.id, mute.childSessionId, account.id),
    ).toBeUndefined();
    expect(pages).toEqual([32, 32]);
  });

  it("finds the answer after any number of empty failed continuations, its whitespace kept (S004-177)", () => {
    expect(answer).toBe("\n  the answer  \n");
  });

  it("does not trim the answer (S004-179)", () => {
    expect(answer).not.toBe(answer?.trim());
    expect(answer?.startsWith("\n  ")).toBe(true);
  });
});
