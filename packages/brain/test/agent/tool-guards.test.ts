import { execFileSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  realpathSync,
  renameSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AgentTool } from "@mariozechner/pi-agent-core";
import { afterAll, describe, expect, it } from "vitest";
import { createChildTools } from "../../src/agent/index.js";
import { captureDelegatedExecutionScope, parseDelegatedExecutionScope } from "../../src/scope/index.js";
import { commitLeftovers, createIsolatedWorktree } from "../../src/workspace/index.js";

// What keeps an agent's tools inside its directory beyond the sandbox's own binds: git metadata, a
// directory swapped under a running session, a forged `.git`, and the search tools. Real files, real bwrap.
const root = realpathSync(mkdtempSync(join(tmpdir(), "crw-guards-")));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let n = 0;
const fresh = (name = "w") => {
  const dir = join(root, `${name}${n++}`);
  mkdirSync(dir, { recursive: true });
  return dir;
};
const git = (cwd: string, ...args: string[]) => execFileSync("git", args, { cwd, encoding: "utf8" }).trim();

function tools(dir: string): Record<string, AgentTool> {
  const scope = parseDelegatedExecutionScope(
    captureDelegatedExecutionScope({ accountId: "acct", target: { kind: "host", ref: null }, workDir: dir }),
  );
  return Object.fromEntries(
    createChildTools({ workDir: dir, scope, shellTimeoutMs: 20_000 }).map((t) => [t.name, t]),
  );
}

async function call(
  dir: string,
  name: string,
  params: Record<string, unknown>,
): Promise<{ ok: boolean; text: string }> {
  const tool = tools(dir)[name];
  if (!tool) throw new Error(`no tool ${name}`);
  try {
    const out = await tool.execute("c", params);
    const part = out.content[0];
    return { ok: true, text: part?.type === "text" ? part.text : "" };
  } catch (e) {
    return { ok: false, text: e instanceof Error ? e.message : String(e) };
  }
}

describe("git metadata is crw's, not the agent's", () => {
  it("write and edit refuse any path through .git, so no hook or config can be planted for crw's git", async () => {
    const dir = fresh();
    git(dir, "init", "-q", "-b", "main");
    for (const path of [".git/hooks/pre-commit", ".git/config", "sub/.git", ".git"]) {
      const w = await call(dir, "write", { path, content: "#!/bin/sh\ntouch /tmp/pwned\n" });
      expect(w.ok, path).toBe(false);
      expect(w.text).toMatch(/git metadata/);
    }
    const e = await call(dir, "edit", { path: ".git/HEAD", oldText: "ref", newText: "x" });
    expect(e.text).toMatch(/git metadata/);
    expect(readFileSync(join(dir, ".git/HEAD"), "utf8")).toMatch(/^ref: /);
  });

  it("crw's own commit in a worktree runs no hook the repository names", async () => {
    const repo = fresh("repo");
    git(repo, "init", "-q", "-b", "main");
    writeFileSync(join(repo, "a"), "a\n");
    git(repo, "add", ".");
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a");
    const marker = join(root, `hook-ran-${n}`);
    writeFileSync(join(repo, ".git/hooks/pre-commit"), `#!/bin/sh\ntouch ${marker}\n`, { mode: 0o755 });
    writeFileSync(join(repo, ".git/hooks/post-checkout"), `#!/bin/sh\ntouch ${marker}\n`, { mode: 0o755 });
    const made = await createIsolatedWorktree({
      repoDir: repo,
      worktreesDir: fresh("wt"),
      branch: "crw/hooks",
      from: { head: true },
    });
    writeFileSync(join(made.path, "b"), "b\n");
    const done = await commitLeftovers({ worktree: { path: made.path, branch: made.branch }, message: "m" });
    expect(done.committed).toBe(true);
    expect(existsSync(marker)).toBe(false);
  });

  it("a forged .git file in the working directory does not make the sandbox show a directory outside it", async () => {
    const outside = fresh("outside");
    writeFileSync(join(outside, "secret"), "s3cret\n");
    mkdirSync(join(outside, "worktrees", "x"), { recursive: true });
    const dir = fresh();
    // The shell may write the working directory: it forges a worktree pointer whose common dir is `outside`.
    mkdirSync(join(dir, "gd"));
    writeFileSync(join(dir, ".git"), "gitdir: gd\n");
    writeFileSync(join(dir, "gd", "commondir"), `${outside}\n`);
    writeFileSync(join(dir, "gd", "gitdir"), `${join(dir, ".git")}\n`);
    const r = await call(dir, "shell", { command: `cat ${join(outside, "secret")}` });
    expect(r.ok).toBe(false);
    expect(r.text).toMatch(/No such file or directory/);
    expect(r.text).not.toContain("s3cret");
  });
});

describe("a working directory swapped under a session", () => {
  it("refuses every call once the directory resolves elsewhere (a link put in its place)", async () => {
    const parent = fresh("swap");
    const dir = join(parent, "work");
    mkdirSync(dir);
    const elsewhere = fresh("elsewhere");
    writeFileSync(join(elsewhere, "f"), "outside\n");
    const t = tools(dir);
    renameSync(dir, join(parent, "moved"));
    symlinkSync(elsewhere, dir);
    for (const [name, params] of [
      ["read", { path: "f" }],
      ["write", { path: "g", content: "x" }],
      ["shell", { command: "cat f" }],
      ["ls", {}],
    ] as const) {
      let text = "";
      try {
        await t[name]?.execute("c", params);
      } catch (e) {
        text = (e as Error).message;
      }
      expect(text, name).toMatch(/working directory moved or vanished/);
    }
    expect(existsSync(join(elsewhere, "g"))).toBe(false);
  });
});

describe("search tools: ls, find and grep", () => {
  it("list, find by name and search contents inside the working directory, with arguments never parsed as shell", async () => {
    const dir = fresh();
    mkdirSync(join(dir, "src"));
    writeFileSync(join(dir, "src", "a.ts"), "export const one = 1;\nconst it's = 'quoted';\n");
    writeFileSync(join(dir, "src", "b.js"), "one two\n");
    writeFileSync(join(dir, "README.md"), "hello\n");
    expect((await call(dir, "ls", {})).text.split("\n")).toEqual(
      expect.arrayContaining(["README.md", "src/"]),
    );
    expect((await call(dir, "find", { pattern: "*.ts" })).text.trim()).toBe("./src/a.ts");
    const hits = await call(dir, "grep", { pattern: "one", glob: "*.ts" });
    expect(hits.text.trim()).toBe("src/a.ts:1:export const one = 1;");
    // A quote and shell syntax in a pattern are text to match, not commands.
    expect((await call(dir, "grep", { pattern: "it's", literal: true })).text).toContain("src/a.ts:2:");
    const marker = join(root, `injected-${n}`);
    await call(dir, "grep", { pattern: `x'; touch ${marker}; '` });
    expect(existsSync(marker)).toBe(false);
    expect((await call(dir, "grep", { pattern: "absent-text" })).text).toBe("(no matches)");
    const out = await call(dir, "ls", { path: ".." });
    expect(out.ok).toBe(false);
    expect(out.text).toMatch(/outside the working directory/);
  });
});
