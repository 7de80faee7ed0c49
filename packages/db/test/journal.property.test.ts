import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { journalBodySchema, PgDelegationRepository } from "../src/index.js";

const db = useTestDatabase();

describe("bad journal input (property)", () => {
  it("any body that does not match the journal schema is refused with a typed error and nothing is written", async () => {
    const r = new PgDelegationRepository(db.pool);
    const account = await r.createAccount({ name: `prop-${randomUUID()}` });
    const session = await r.createRootSession(account.id, "scripted");
    const good = { type: "message", message: { role: "user", content: "fine" } };
    const arbitraryBody = fc.oneof(
      fc.anything(),
      fc.record({
        type: fc.constantFrom("message", "compaction", "tool_intent", "other"),
        message: fc.anything(),
      }),
      fc.record({
        type: fc.constant("message"),
        message: fc.record({
          role: fc.constantFrom("user", "assistant", "toolResult", "custom", "system"),
          content: fc.anything(),
        }),
      }),
    );
    await fc.assert(
      fc.asyncProperty(arbitraryBody, async (body) => {
        fc.pre(!journalBodySchema.safeParse(body).success);
        await expect(
          r.append(session.id, account.id, [{ body: good as never }, { body: body as never }]),
        ).rejects.toMatchObject({
          code: "malformed_entry",
        });
      }),
      { numRuns: 150 },
    );
    expect(await r.readJournal(session.id, account.id)).toEqual([]);
  });
});
