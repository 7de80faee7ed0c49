import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { ASSISTANT_PAGE, type SpillStore } from "../../src/index.js";
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
  it("S004-236: S004-237: S004-238: S004-239: an above-limit result is spilled complete and the parent gets the bounded placeholder", async () => {
    const limit = 200;
    const { service } = makeService(db.pool, { toolResultInlineBytes: () => limit });
    const body = `héllo ${"x".repeat(3000)} end`;
    const { delivered } = await backgroundResult(service, body);
    const size = Buffer.byteLength(body);
    const path = delivered.details?.spillPath ?? "";
    expect(delivered.details?.byteSize).toBe(size);
    expect(readFileSync(path, "utf8")).toBe(body);
    expect(delivered.content).toContain(path);
    expect(delivered.content).toContain(`${size} bytes`);
    expect(delivered.content).toContain("héllo xxx");
    expect(Buffer.byteLength(delivered.content)).toBeLessThan(size);
    const spill = await db.pool.query("select byte_size from spilled_outputs where path = $1", [path]);
    expect(Number(spill.rows[0]?.byte_size)).toBe(size);
  });

  it("S004-242: spilling does not acknowledge delivery: the result waits in the inbox until the parent's journal commit", async () => {
    const { service, repo } = makeService(db.pool, { toolResultInlineBytes: () => 16 });
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
    const [queued] = await waitFor(async () => {
      const q = await repo.queuedResults(parent.id, account.id);
      return q.length === 1 ? q : undefined;
    }, "spilled result queued");
    expect(queued?.spillPath).toBeTruthy();
    expect(readFileSync(queued?.spillPath ?? "", "utf8")).toBe("a result well above sixteen bytes");
    expect(await repo.settledResultIds(parent.id, account.id)).toEqual([]);
    release();
    await busy;
    service.parentIdle(parent);
    await waitFor(async () => (await repo.settledResultIds(parent.id, account.id)).length === 1, "delivered");
    await service.whenIdle();
  });

  it("S004-237: a body of exactly the limit (UTF-8 bytes) stays inline", async () => {
    const body = "é".repeat(50); // 100 bytes, 50 characters
    const { service } = makeService(db.pool, { toolResultInlineBytes: () => 100 });
    const { delivered } = await backgroundResult(service, body);
    expect(delivered.details?.spillPath).toBeUndefined();
    expect(delivered.content.endsWith(`\n${body}`)).toBe(true);
  });

  it("S004-241: a failed spill write is an explicit error result with a DelegateRead hint, never a truncated success", async () => {
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
    expect(delivered.content).not.toContain("a result longer");
  });
});

describe("readSubagent", () => {
  it("S004-175: S004-176: S004-177: S004-179: pages newest-first by 32 past empty failed continuations and keeps whitespace", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const first = await delegateForeground(
      service,
      { parent, account },
      "d",
      scriptTask({ answer: "\n  the answer  \n" }),
    );
    if (first.kind !== "result") throw new Error("expected a result");
    // more empty failed continuations than two pages
    const empties = ASSISTANT_PAGE * 2 + 5;
    await repo.append(
      first.childSessionId,
      account.id,
      Array.from({ length: empties }, () => ({
        body: {
          type: "message" as const,
          message: {
            role: "assistant" as const,
            content: [{ type: "text" as const, text: "  " }],
            stopReason: "error" as const,
          },
        },
      })),
    );
    const reads: number[] = [];
    const counting = Object.create(repo) as typeof repo;
    counting.recentAssistantMessages = (s, p, l, b) => {
      reads.push(l);
      return repo.recentAssistantMessages(s, p, l, b);
    };
    const { readSubagent } = await import("../../src/index.js");
    expect(await readSubagent(counting, parent.id, first.childSessionId, account.id)).toBe(
      "\n  the answer  \n",
    );
    expect(reads).toEqual([32, 32, 32]);
  });

  it("S004-178: S004-252: the ownership guard runs before the read", async () => {
    const { service } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const stranger = await service.repo.createAccount({ name: `s-${randomUUID()}` });
    const r = await delegateForeground(service, { parent, account }, "d", scriptTask({ answer: "secret" }));
    if (r.kind !== "result") throw new Error("expected a result");
    await expect(service.readSubagent(parent.id, r.childSessionId, stranger.id)).rejects.toMatchObject({
      code: "not_found",
    });
    await expect(service.readSubagent(parent.id, r.childSessionId, account.id)).resolves.toBe("secret");
  });
});

describe("the ordinary last-row reply reader", () => {
  it("S004-180: a call's result reads one assistant row; an empty last answer never surfaces an older call's reply", async () => {
    const base = makeService(db.pool);
    const limits: number[] = [];
    const counting = Object.create(base.repo) as typeof base.repo;
    counting.recentAssistantMessages = (s, p, l, b) => {
      limits.push(l);
      return base.repo.recentAssistantMessages(s, p, l, b);
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
    // Settlement read one row per call; only DelegateRead pages (and finds the older answer).
    expect(limits.length).toBeGreaterThan(0);
    expect(limits.every((l) => l === 1)).toBe(true);
    limits.length = 0;
    expect(await service.readSubagent(parent.id, first.childSessionId, account.id)).toBe("the first answer");
    expect(limits).toEqual([ASSISTANT_PAGE]);
    await service.close();
  });
});
