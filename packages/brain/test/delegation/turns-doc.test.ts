import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { DelegationError, type DelegationService } from "../../src/index.js";
import {
  delegateForeground,
  gateTool,
  latch,
  makeService,
  newParent,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

const DOC = fileURLToPath(new URL("../../../../docs/modules/brain/turns.md", import.meta.url));

interface Row {
  readonly caller: "plan" | "build";
  readonly child: string;
  readonly request: string;
  readonly outcome: string;
}

/** The admission table of docs/modules/brain/turns.md, as written there. */
function admissionTable(): Row[] {
  const text = readFileSync(DOC, "utf8");
  const at = text.indexOf("<!-- admission-table");
  expect(at).toBeGreaterThan(0);
  const rows: Row[] = [];
  for (const line of text.slice(at).split("\n").slice(1)) {
    if (rows.length > 0 && !line.startsWith("|")) break;
    if (!line.startsWith("|") || line.includes("---") || line.includes("| caller |")) continue;
    const [caller, child, request, outcome] = line
      .split("|")
      .slice(1, -1)
      .map((c) => c.trim());
    expect(caller === "plan" || caller === "build").toBe(true);
    rows.push({
      caller: caller as Row["caller"],
      child: child ?? "",
      request: request ?? "",
      outcome: outcome ?? "",
    });
  }
  return rows;
}

async function situation(service: DelegationService, child: string) {
  const { account, parent } = await newParent(service);
  const first = await delegateForeground(
    service,
    { parent, account },
    "first",
    scriptTask({ answer: "ready" }),
  );
  if (first.kind !== "result") throw new Error("expected a result");
  const childId = first.childSessionId;
  if (child === "idle after read-only") {
    await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: childId,
      toolCallId: "planned",
      text: scriptTask({ answer: "looked" }),
      mode: "foreground",
      callerReadOnly: true,
    });
  } else if (child === "working" || child === "working read-only") {
    await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: childId,
      toolCallId: "busy",
      text: scriptTask({ rounds: [[{ name: "Gate", arguments: { key: "hold" } }]], answer: "held" }),
      mode: "background",
      callerReadOnly: child === "working read-only",
    });
    await waitFor(
      async () => (await service.repo.openRunForChild(childId, account.id))?.status === "running",
      "busy",
    );
  } else {
    expect(child).toBe("idle");
  }
  return { account, parent, childId };
}

describe("docs/modules/brain/turns.md", () => {
  it("the plan-mode admission rule and clamp are documented, and every documented row is what the code does (S004-228)", async () => {
    const doc = readFileSync(DOC, "utf8");
    for (const term of [
      "read_only_scope",
      "readOnlyContinuationScope",
      "before dispatch",
      "write_access_refused",
    ]) {
      expect(doc).toContain(term);
    }
    const rows = admissionTable();
    expect(rows.length).toBeGreaterThanOrEqual(8);
    for (const row of rows) {
      const gates = new Map<string, Promise<void>>();
      const { service, repo } = makeService(db.pool, { tools: () => [gateTool("Gate", gates)] });
      const holdAll = latch();
      gates.set("hold", holdAll.promise);
      const { account, parent, childId } = await situation(service, row.child);
      let outcome: string;
      try {
        const receipt = await service.continueSubagent({
          parentSessionId: parent.id,
          principalAccountId: account.id,
          childSessionId: childId,
          toolCallId: "asked",
          text: scriptTask({ answer: "answered" }),
          mode: "foreground",
          callerReadOnly: row.caller === "plan",
          ...(row.request === "continue with write access" ? { writeAccess: true } : {}),
        });
        if (receipt.kind === "steered") outcome = "steered";
        else {
          const run = await repo.getRun(receipt.runId, account.id);
          outcome = run.readOnlyScope === null ? "unclamped" : "clamped";
          if (outcome === "clamped")
            expect(JSON.parse(run.readOnlyScope ?? "")).toMatchObject({ readOnly: true });
        }
      } catch (e) {
        if (!(e instanceof DelegationError)) throw e;
        outcome = e.code;
        // A refusal writes nothing.
        expect(await repo.runForToolCall(parent.id, "asked", account.id)).toBeNull();
      }
      expect({ ...row, outcome }).toEqual(row);
      holdAll.open();
      await service.whenIdle();
      await service.close();
    }
  });
});
