import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { useTestDatabase } from "@crw/tools/pg";
import { afterAll, describe, expect, it } from "vitest";
import type { MutatingTool, Script } from "../../src/index.js";
import { makeRepo, sh } from "../workspace/helpers.js";
import { delegateCall, makeService, messages, newParent, repoWith, scriptTask } from "./helpers.js";

const db = useTestDatabase();

const repos: (() => void)[] = [];
afterAll(() => {
  for (const cleanup of repos) cleanup();
});

/**
 * The child's way to leave work behind: writes `path` in its working directory (the worktree, when it is
 * isolated). With `lockIndex`, another git process then holds the worktree's index, so crw's commit of it
 * cannot stage anything.
 */
const putTool: MutatingTool = {
  name: "Put",
  description: "writes a file in the working directory",
  parameters: {},
  mutates: true,
  async execute(args, ctx) {
    if (!ctx.workDir) throw new Error("no working directory");
    writeFileSync(join(ctx.workDir, String(args.path)), String(args.content));
    if (args.lockIndex)
      writeFileSync(sh(ctx.workDir, "rev-parse", "--path-format=absolute", "--git-path", "index.lock"), "");
    return { content: `wrote ${String(args.path)}` };
  },
};

const put = (path: string, extra: Record<string, unknown> = {}) => ({
  name: "Put",
  arguments: { path, content: `${path} from the child\n`, ...extra },
});

/**
 * An owner's root session working in a fresh git repository (its one commit on main), of a service that
 * keeps isolated children's worktrees beside it and whose repository counts the lookups of a child's
 * worktree row (`worktreeReads`). `keepsWorktrees: false`: a host without worktrees; `inRepository:
 * false`: a root session with no working directory.
 */
async function parentInRepository({ keepsWorktrees = true, inRepository = true } = {}) {
  const made = makeRepo();
  repos.push(made.cleanup);
  let worktreeReads = 0;
  const repo = repoWith(db.pool, {
    isolatedWorktree: (real) => (sessionId, principal) => {
      worktreeReads++;
      return real(sessionId, principal);
    },
  });
  const { service } = makeService(db.pool, {
    repo,
    tools: () => [putTool],
    ...(keepsWorktrees && { worktreesDir: made.worktrees }),
  });
  const { account } = await newParent(service, { isOwner: true });
  const parent = await service.createRootSession(
    account.id,
    "scripted",
    inRepository ? { cwd: made.repo } : {},
  );
  return { ...made, service, account, parent, worktreeReads: () => worktreeReads };
}

/**
 * The parent's turn that delegates `child` in the foreground (with `extra` Delegate arguments) and then
 * answers; the Delegate's tool result as the parent's journal holds it.
 */
async function delegateFromParent(
  made: Awaited<ReturnType<typeof parentInRepository>>,
  child: Script,
  extra: Record<string, unknown>,
) {
  const { service, account, parent } = made;
  await service.prompt(
    parent.id,
    account.id,
    scriptTask({ rounds: [[delegateCall(child, extra)]], answer: "parent done" }),
  );
  await service.whenIdle();
  const journal = await service.repo.readJournal(parent.id, account.id);
  const result = messages(journal).find((m) => m.role === "toolResult" && m.toolName === "Delegate");
  if (result?.role !== "toolResult" || typeof result.content !== "string")
    throw new Error("the parent has no Delegate result");
  await service.close();
  return { text: result.content, isError: result.isError };
}

const COMMITTED = /\[crw\] committed on branch (crw\/[0-9a-f]{12}) at ([0-9a-f]{12}) \(/;

/** The branch and commit a result names, the commit resolved in `repo`. */
function namedCommit(repo: string, text: string) {
  const [, branch = "", short = ""] = COMMITTED.exec(text) ?? [];
  expect(branch, text).not.toBe("");
  const commit = sh(repo, "rev-parse", "--verify", `${short}^{commit}`);
  return { branch, commit };
}

describe("the settlement of a child placed in an isolated worktree", () => {
  it("commits what the child left on its branch, and the parent's result names the branch and the commit", async () => {
    const made = await parentInRepository();
    const base = sh(made.repo, "rev-parse", "main");
    const { text, isError } = await delegateFromParent(
      made,
      { rounds: [[put("notes.txt")]], answer: "wrote the notes" },
      { isolation: "worktree" },
    );
    expect(isError).toBe(false);
    expect(text.startsWith("wrote the notes\n\n[crw] committed on branch crw/")).toBe(true);
    expect(text).toContain("notes.txt");
    const { branch, commit } = namedCommit(made.repo, text);
    expect(sh(made.repo, "rev-parse", branch)).toBe(commit);
    expect(sh(made.repo, "rev-parse", `${commit}^`)).toBe(base);
    expect(sh(made.repo, "show", `${commit}:notes.txt`)).toBe("notes.txt from the child");
    // The parent's own checkout is untouched: the work is on the child's branch only.
    expect(sh(made.repo, "rev-parse", "main")).toBe(base);
    expect(existsSync(join(made.repo, "notes.txt"))).toBe(false);
  });

  it("a child whose turn fails still gets its work committed, named in the error result", async () => {
    const made = await parentInRepository();
    const { text, isError } = await delegateFromParent(
      made,
      { rounds: [[put("half.txt")]], failAtRequest: 1 },
      { isolation: "worktree" },
    );
    expect(isError).toBe(true);
    expect(text.startsWith("scripted provider failure\n\n[crw] committed on branch crw/")).toBe(true);
    const { branch, commit } = namedCommit(made.repo, text);
    expect(sh(made.repo, "rev-parse", branch)).toBe(commit);
    expect(sh(made.repo, "show", `${commit}:half.txt`)).toBe("half.txt from the child");
  });

  it("a commit git refuses (the worktree's index held by another git) still settles, the result saying why, where the work waits and how to land it", async () => {
    const made = await parentInRepository();
    const base = sh(made.repo, "rev-parse", "main");
    const { text, isError } = await delegateFromParent(
      made,
      { rounds: [[put("kept.txt", { lockIndex: true })]], answer: "wrote it" },
      { isolation: "worktree" },
    );
    expect(isError).toBe(false);
    expect(text).toMatch(
      /^wrote it\n\n\[crw\] the work in the child's worktree could not be committed: git add --all -- \. failed in \S+: fatal: Unable to create '\S+index\.lock': File exists/,
    );
    expect(text).not.toMatch(COMMITTED);
    // Nothing was committed; what the child wrote stays in its worktree for a later commit.
    const branch = sh(made.repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/crw/");
    expect(sh(made.repo, "rev-parse", branch)).toBe(base);
    const worktree = sh(made.repo, "worktree", "list", "--porcelain")
      .split("\n")
      .filter((l) => l.startsWith("worktree "))
      .map((l) => l.slice("worktree ".length))
      .find((p) => p.startsWith(made.worktrees));
    expect(readFileSync(join(worktree ?? "", "kept.txt"), "utf8")).toBe("kept.txt from the child\n");
    // The result says where the work waits and how to go on with it.
    const { rows } = await db.pool.query("select id from sessions where parent_session_id = $1::uuid", [
      made.parent.id,
    ]);
    expect(rows).toHaveLength(1);
    expect(text.split("\n").at(-1)).toBe(
      `[crw] it stays uncommitted in ${worktree} (branch ${branch}): commit it there, then land it with 'crw session land ${rows[0].id}'`,
    );
    // Followed as it says: the other git gone, the work committed there, then landed.
    rmSync(sh(worktree ?? "", "rev-parse", "--path-format=absolute", "--git-path", "index.lock"));
    sh(worktree ?? "", "add", "--all");
    sh(worktree ?? "", "commit", "-q", "-m", "the child's work, by hand");
    const { service } = makeService(db.pool, { worktreesDir: made.worktrees });
    await service.land(rows[0].id, made.account.id);
    await service.close();
    expect(sh(made.repo, "show", "main:kept.txt")).toBe("kept.txt from the child");
  });
});

describe("the settlement of a child not placed under the host's worktrees", () => {
  it("a child working in the shared directory while the host keeps worktrees commits nothing and looks for no worktree", async () => {
    const made = await parentInRepository();
    const commits = sh(made.repo, "rev-list", "--all", "--count");
    const { text, isError } = await delegateFromParent(
      made,
      { rounds: [[put("shared.txt")]], answer: "wrote in place" },
      {},
    );
    expect(isError).toBe(false);
    expect(text).toBe("wrote in place");
    expect(sh(made.repo, "rev-list", "--all", "--count")).toBe(commits);
    expect(sh(made.repo, "status", "--porcelain")).toBe("?? shared.txt");
    expect(sh(made.repo, "branch", "--list", "crw/*")).toBe("");
    // Only a child placed under the worktrees can have one: its settlement does not ask for a worktree row.
    expect(made.worktreeReads()).toBe(0);
  });

  it("a child with no working directory, while the host keeps worktrees, settles with its answer alone", async () => {
    const made = await parentInRepository({ inRepository: false });
    const { text, isError } = await delegateFromParent(made, { answer: "nothing to write" }, {});
    expect({ text, isError }).toEqual({ text: "nothing to write", isError: false });
    expect(made.worktreeReads()).toBe(0);
  });

  it("on a host that keeps no worktrees, a child in the shared directory settles with its answer alone", async () => {
    const made = await parentInRepository({ keepsWorktrees: false });
    const commits = sh(made.repo, "rev-list", "--all", "--count");
    const { text, isError } = await delegateFromParent(
      made,
      { rounds: [[put("shared.txt")]], answer: "wrote in place" },
      {},
    );
    expect({ text, isError }).toEqual({ text: "wrote in place", isError: false });
    expect(sh(made.repo, "rev-list", "--all", "--count")).toBe(commits);
    expect(made.worktreeReads()).toBe(0);
  });
});
