import { execFileSync } from "node:child_process";
import { mkdirSync, realpathSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  createScriptedTurnRunner,
  eligibleInstructionFiles,
  instructionRootFor,
  type SessionTurnRunner,
} from "../../src/index.js";
import { makeService, newParent, scratchDir, scriptTask } from "./helpers.js";

const db = useTestDatabase();

const git = (cwd: string, ...args: string[]) =>
  execFileSync("git", args, {
    cwd,
    stdio: "pipe",
    env: {
      ...process.env,
      GIT_AUTHOR_NAME: "t",
      GIT_AUTHOR_EMAIL: "t@example.invalid",
      GIT_COMMITTER_NAME: "t",
      GIT_COMMITTER_EMAIL: "t@example.invalid",
    },
  });

/** A real repository with a linked worktree (made by Git), and instruction files around and inside both. */
function layout() {
  const base = realpathSync(scratchDir("crw-instr-"));
  const repo = join(base, "repo");
  mkdirSync(join(repo, "sub"), { recursive: true });
  writeFileSync(join(base, "AGENTS.md"), "ABOVE-ROOT");
  writeFileSync(join(repo, "AGENTS.md"), "ORIGIN-ROOT");
  writeFileSync(join(repo, "sub", "AGENTS.md"), "ORIGIN-SUB");
  git(repo, "init", "-q", "-b", "main");
  git(repo, "add", ".");
  git(repo, "commit", "-q", "-m", "init");
  const wt = join(base, "wt");
  git(repo, "worktree", "add", "-q", wt, "-b", "feature");
  writeFileSync(join(wt, "AGENTS.md"), "WORKTREE-ROOT");
  writeFileSync(join(wt, "sub", "AGENTS.md"), "WORKTREE-SUB");
  mkdirSync(join(wt, ".crw", "rules"), { recursive: true });
  writeFileSync(join(wt, ".crw", "rules", "style.md"), "WORKTREE-RULE");
  mkdirSync(join(wt, "sub", "deeper"), { recursive: true });
  writeFileSync(join(wt, "sub", "deeper", "AGENTS.md"), "BELOW-WORKDIR");
  mkdirSync(join(wt, "other"), { recursive: true });
  writeFileSync(join(wt, "other", "AGENTS.md"), "SIBLING");
  return { base, repo, wt };
}

describe("instruction eligibility and worktree placement", () => {
  it("the owner-ancestor rule: the root's files and rules, then each directory down to the working directory (S004-264)", async () => {
    const { repo, wt } = layout();
    const root = await instructionRootFor(join(wt, "sub"));
    // The worktree's own root, not the repository it was added from.
    expect(root).toBe(wt);
    const files = await eligibleInstructionFiles(join(wt, "sub"), root);
    expect(files.map((f) => f.text)).toEqual(["WORKTREE-ROOT", "WORKTREE-RULE", "WORKTREE-SUB"]);
    // In the origin repository the origin's files are eligible, and only those.
    const origin = await eligibleInstructionFiles(
      join(repo, "sub"),
      await instructionRootFor(join(repo, "sub")),
    );
    expect(origin.map((f) => f.text)).toEqual(["ORIGIN-ROOT", "ORIGIN-SUB"]);
    // A registered project root below the working tree's root bounds the rule from above.
    expect(await instructionRootFor(join(repo, "sub"), join(repo, "sub"))).toBe(join(repo, "sub"));
    // A worktree of a registered project's repository: the project's place in the worktree.
    expect(await instructionRootFor(join(wt, "sub"), repo)).toBe(wt);
    // A directory outside the root gets nothing.
    expect(await eligibleInstructionFiles(join(wt, "sub"), join(repo, "sub"))).toEqual([]);
  });

  it("a worktree placement keeps its origin's ref, composes from its own instruction root, and read-only turns keep the placement (S004-263 S004-265 S004-264)", async () => {
    const { repo, wt } = layout();
    const scripted = createScriptedTurnRunner();
    const turns: { sessionId: string; workDir: string | null; readOnly: boolean }[] = [];
    const runner: SessionTurnRunner = {
      runTurn(request, host) {
        turns.push({ sessionId: request.sessionId, workDir: request.workDir, readOnly: request.readOnly });
        return scripted.runTurn(request, host);
      },
    };
    const { service, repo: rows } = makeService(db.pool, {
      runner,
      projects: {
        projectForPath: (dir) => (dir === repo ? { ref: "proj", root: repo } : undefined),
        rootOf: (ref) => (ref === "proj" ? { ref, root: repo } : undefined),
      },
    });
    const { account, parent } = await newParent(service, { isOwner: true });
    const first = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "wt",
      task: scriptTask({ answer: "placed" }),
      mode: "foreground",
      workDir: join(wt, "sub"),
    });
    if (first.kind !== "result") throw new Error("expected a result");
    const child = await rows.getSession(first.childSessionId, account.id);
    const scope = JSON.parse(child.scope ?? "{}");
    expect(scope).toMatchObject({ workDir: join(wt, "sub"), target: { kind: "host", ref: "proj" } });
    const prompt = child.systemPrompt ?? "";
    for (const text of ["WORKTREE-ROOT", "WORKTREE-RULE", "WORKTREE-SUB"]) expect(prompt).toContain(text);
    for (const text of ["ORIGIN-ROOT", "ORIGIN-SUB", "ABOVE-ROOT", "BELOW-WORKDIR", "SIBLING"])
      expect(prompt).not.toContain(text);
    expect(prompt.indexOf("WORKTREE-ROOT")).toBeLessThan(prompt.indexOf("WORKTREE-SUB"));

    // A continuation from a read-only turn runs read-only in the same validated worktree placement, with
    // the same stored composition.
    const again = await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: child.id,
      toolCallId: "ro",
      text: scriptTask({ answer: "looked" }),
      mode: "foreground",
      callerReadOnly: true,
    });
    expect(again).toMatchObject({ kind: "result", body: "looked" });
    const childTurns = turns.filter((t) => t.sessionId === child.id);
    expect(childTurns).toEqual([
      { sessionId: child.id, workDir: join(wt, "sub"), readOnly: false },
      { sessionId: child.id, workDir: join(wt, "sub"), readOnly: true },
    ]);
    expect((await rows.getSession(child.id, account.id)).systemPrompt).toBe(prompt);
    await service.close();
  });
});
