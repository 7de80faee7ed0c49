import { PgDelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { createScriptedTurnRunner, SessionTurns, type TurnRequest } from "../../src/index.js";

const db = useTestDatabase();

describe("a host-minted turn purpose", () => {
  it("reaches the runner as TurnRequest.purpose; an ordinary turn carries none", async () => {
    const repo = new PgDelegationRepository(db.pool);
    const account = await repo.createAccount({ name: `purpose-${Date.now()}` });
    const session = await repo.createRootSession(account.id, "scripted");
    const seen: TurnRequest[] = [];
    const base = createScriptedTurnRunner();
    const turns = new SessionTurns(repo, {
      runTurn: (request, host) => {
        seen.push(request);
        return base.runTurn(request, host);
      },
    });
    const turn = (text: string, purpose?: "skill-review") =>
      turns.exclusive(session.id, () =>
        turns.runLocked({
          session,
          input: [{ body: { type: "message", message: { role: "user", content: text } } }],
          tools: [],
          scope: null,
          readOnly: false,
          systemPrompt: "p",
          progress: () => {},
          drainSteering: async () => [],
          identity: { principalAccountId: account.id },
          ...(purpose ? { purpose } : {}),
        }),
      );
    expect((await turn("ordinary")).stopReason).toBe("stop");
    expect((await turn("review", "skill-review")).stopReason).toBe("stop");
    expect(seen.map((r) => r.purpose)).toEqual([undefined, "skill-review"]);
    expect("purpose" in (seen[0] as object)).toBe(false);
  });
});
