import { execFile, execFileSync } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import {
  admitStoredWorkDir,
  captureDelegatedExecutionScope,
  DelegatedScopeError,
  delegatedWorkDir,
  isCanonicalArtifactPath,
  parseDelegatedExecutionScope,
  pathSpelling,
  projectContextRoot,
} from "../../src/scope/index.js";

const run = promisify(execFile);

const root = realpathSync(mkdtempSync(join(tmpdir(), "crw-workdir-")));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const project = join(root, "proj");
mkdirSync(join(project, "src"), { recursive: true });
mkdirSync(join(project, ".git"));
const outside = join(root, "elsewhere");
mkdirSync(outside);

/**
 * Places a directory its owner alone may read, then a readable one, as a process that does not own them.
 * Root reads every directory, so when this suite runs as root an unprivileged process (nobody) does the
 * placing, loading the same sources.
 */
async function unprivilegedPlacements(): Promise<string[]> {
  const base = mkdtempSync(join(tmpdir(), "crw-readable-"));
  const closed = join(base, "closed");
  const open = join(base, "open");
  mkdirSync(closed, { mode: 0o700 });
  mkdirSync(open);
  chmodSync(base, 0o755);
  chmodSync(open, 0o755);
  try {
    const place = async (dir: string) =>
      delegatedWorkDir(dir, { kind: "admin", canExecuteHost: true }).then(
        () => "placed",
        (e: DelegatedScopeError) => `refused ${e.code}`,
      );
    if (process.getuid?.() !== 0) {
      chmodSync(closed, 0o000);
      return [await place(closed), await place(open)];
    }
    const source = fileURLToPath(new URL("../../src/scope/workdir.ts", import.meta.url));
    // No transform cache on disk: jiti would otherwise keep one in the temporary directory, owned by nobody.
    const script = `
      const { createJiti } = await import("jiti");
      const { delegatedWorkDir } = await createJiti(import.meta.url, { fsCache: false }).import(${JSON.stringify(source)});
      for (const dir of ${JSON.stringify([closed, open])})
        console.log(await delegatedWorkDir(dir, { kind: "admin", canExecuteHost: true }).then(
          () => "placed", (e) => "refused " + e.code));`;
    const { stdout } = await run(process.execPath, ["--input-type=module", "-e", script], {
      uid: 65534,
      gid: 65534,
      cwd: fileURLToPath(new URL("../..", import.meta.url)),
    });
    return stdout.trim().split("\n");
  } finally {
    rmSync(base, { recursive: true, force: true });
  }
}

async function refusal(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
  } catch (e) {
    if (e instanceof DelegatedScopeError) return e.code;
    throw e;
  }
  return "accepted";
}

describe("delegatedWorkDir", () => {
  it("scoped callers stay inside the selected host project (S004-257)", async () => {
    const placed = await delegatedWorkDir(join(project, "src"), {
      kind: "scoped",
      project: { ref: "proj", root: project },
    });
    expect(placed).toEqual({
      workDir: join(project, "src"),
      target: { kind: "host", ref: "proj" },
      projectRef: "proj",
      instructionRoot: project,
    });
    expect(
      await refusal(delegatedWorkDir(outside, { kind: "scoped", project: { ref: "proj", root: project } })),
    ).toBe("work_dir_outside_project");
    expect(
      await refusal(
        delegatedWorkDir(`${project}/../elsewhere`, {
          kind: "scoped",
          project: { ref: "proj", root: project },
        }),
      ),
    ).toBe("work_dir_outside_project");
  });

  it("the same path is accepted or refused by the policy it is checked against", async () => {
    const scoped = { kind: "scoped", project: { ref: "proj", root: project } } as const;
    expect(await refusal(delegatedWorkDir(outside, scoped))).toBe("work_dir_outside_project");
    expect((await delegatedWorkDir(outside, { kind: "admin", canExecuteHost: true })).workDir).toBe(outside);
    expect(await refusal(delegatedWorkDir(outside, { kind: "admin", canExecuteHost: false }))).toBe(
      "work_dir_not_permitted",
    );
  });

  it("an all-access administrator with canExecuteHost may select any existing readable host directory (S004-259)", async () => {
    const placed = await delegatedWorkDir(outside, { kind: "admin", canExecuteHost: true });
    expect(placed.workDir).toBe(outside);
    expect(
      await refusal(delegatedWorkDir(join(root, "missing"), { kind: "admin", canExecuteHost: true })),
    ).toBe("work_dir_unavailable");
    // A file, even one anybody may execute, is not a directory.
    const tool = join(root, "tool.sh");
    writeFileSync(tool, "#!/bin/sh\n");
    chmodSync(tool, 0o755);
    expect(await refusal(delegatedWorkDir(tool, { kind: "admin", canExecuteHost: true }))).toBe(
      "work_dir_unavailable",
    );
    // A directory the placing process may not read is refused; a readable one beside it is placed.
    expect(await unprivilegedPlacements()).toEqual(["refused work_dir_unavailable", "placed"]);
  });

  it("projectForPath resolves a registered host project (S004-260)", async () => {
    const placed = await delegatedWorkDir(project, {
      kind: "admin",
      canExecuteHost: true,
      projectForPath: (dir) => (dir === project ? { ref: "proj", root: project } : undefined),
    });
    expect(placed.target).toEqual({ kind: "host", ref: "proj" });
    expect(placed.projectRef).toBe("proj");
  });

  it("records the project's host ref, or the nameless admin-only host target for an unregistered directory (S004-256 S004-262)", async () => {
    const placed = await delegatedWorkDir(outside, {
      kind: "admin",
      canExecuteHost: true,
      projectForPath: () => undefined,
    });
    expect(placed.target).toEqual({ kind: "host", ref: null });
    expect(placed.projectRef).toBeNull();
    // It persists together with its target in the durable scope.
    const scope = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({
        accountId: "a",
        operator: true,
        target: placed.target,
        projectRef: placed.projectRef,
        workDir: placed.workDir,
      }),
    );
    expect(scope.workDir).toBe(outside);
    expect(scope.target).toEqual({ kind: "host", ref: null });
  });

  it("projectContextRoot proves a linked Git worktree through gitdir/commondir (S004-261)", async () => {
    // Written by hand exactly as Git lays a linked worktree out.
    const repo = join(root, "repo");
    const wt = join(root, "repo-feature");
    mkdirSync(join(repo, ".git", "worktrees", "feature"), { recursive: true });
    writeFileSync(join(repo, ".git", "worktrees", "feature", "commondir"), "../..\n");
    mkdirSync(join(wt, "pkg"), { recursive: true });
    writeFileSync(join(wt, ".git"), `gitdir: ${join(repo, ".git", "worktrees", "feature")}\n`);
    // Without git's link back from the worktree's gitdir, the `.git` file is only a claim: not believed.
    expect(await projectContextRoot(join(wt, "pkg"))).toBeUndefined();
    writeFileSync(join(repo, ".git", "worktrees", "feature", "gitdir"), `${join(wt, ".git")}\n`);
    expect(await projectContextRoot(join(wt, "pkg"))).toEqual({ root: wt, repositoryRoot: repo });
    expect(await projectContextRoot(join(repo))).toEqual({ root: repo, repositoryRoot: repo });
  });

  it("a directory in a sibling worktree of a registered repository is placed under that repository's ref", async () => {
    const repo = join(root, "real-repo");
    mkdirSync(repo);
    const git = (...args: string[]) => execFileSync("git", args, { cwd: repo, stdio: "pipe" });
    git("init", "-q", "-b", "main");
    git(
      "-c",
      "user.email=t@example.invalid",
      "-c",
      "user.name=t",
      "commit",
      "-q",
      "--allow-empty",
      "-m",
      "init",
    );
    const sibling = join(root, "real-repo-wt");
    git("worktree", "add", "-q", sibling, "-b", "side");
    writeFileSync(join(sibling, "AGENTS.md"), "worktree rules");
    const placed = await delegatedWorkDir(sibling, {
      kind: "admin",
      canExecuteHost: true,
      projectForPath: (dir) => (dir === repo ? { ref: "real", root: repo } : undefined),
    });
    expect(placed.target).toEqual({ kind: "host", ref: "real" });
    expect(placed.workDir).toBe(sibling);
    expect(placed.instructionRoot).toBe(sibling);
  });

  it("a managed policy keeps the guest mount as the target root and refuses paths outside it", async () => {
    const policy = { kind: "managed", ref: "guest-1", guestRoot: "/workspace/team" } as const;
    const placed = await delegatedWorkDir("/workspace/team/app/./src", policy);
    expect(placed).toEqual({
      workDir: "/workspace/team/app/src",
      target: { kind: "managed", ref: "guest-1", root: "/workspace/team" },
      projectRef: "guest-1",
      instructionRoot: "/workspace/team",
    });
    expect(await refusal(delegatedWorkDir("/workspace/other", policy))).toBe("work_dir_outside_project");
    expect(await refusal(delegatedWorkDir("/workspace/team/../other", policy))).toBe(
      "work_dir_outside_project",
    );
  });
});

describe("placement spelling", () => {
  it("drive and UNC placements are accepted only for local references, alongside POSIX (S004-077)", async () => {
    const local = { kind: "local", targetId: "laptop" } as const;
    expect((await delegatedWorkDir("C:\\Users\\owner\\repo", local)).workDir).toBe("C:\\Users\\owner\\repo");
    expect((await delegatedWorkDir("\\\\server\\share\\repo", local)).workDir).toBe(
      "\\\\server\\share\\repo",
    );
    expect((await delegatedWorkDir("/home/owner/repo", local)).workDir).toBe("/home/owner/repo");
    // The durable scope's parser: the same three spellings for a local target, only POSIX for the others.
    for (const workDir of ["C:\\Users\\owner\\repo", "\\\\server\\share\\repo", "/home/owner/repo"]) {
      const scope = { accountId: "a", target: { kind: "local", targetId: "laptop" }, workDir };
      expect(parseDelegatedExecutionScope(captureDelegatedExecutionScope(scope)).workDir).toBe(workDir);
    }
    for (const kind of ["host", "managed"] as const) {
      const target = kind === "host" ? { kind, ref: "p" } : { kind, ref: "m", root: "/g" };
      for (const workDir of ["C:\\Users\\owner\\repo", "\\\\server\\share\\repo"])
        expect(() => captureDelegatedExecutionScope({ accountId: "a", target, workDir })).toThrow(/POSIX/);
    }
  });

  it("a Windows placement survives a JSON round trip of its scope unchanged", () => {
    const json = captureDelegatedExecutionScope({
      accountId: "a",
      target: { kind: "local", targetId: "laptop" },
      workDir: "C:\\Users\\owner\\repo",
    });
    const scope = parseDelegatedExecutionScope(JSON.parse(JSON.stringify(json)));
    expect(scope.workDir).toBe("C:\\Users\\owner\\repo");
    expect(scope.target).toEqual({ kind: "local", targetId: "laptop" });
  });

  it("ambiguous drive-relative and current-drive paths are refused (S004-081)", async () => {
    const local = { kind: "local", targetId: "laptop" } as const;
    expect(pathSpelling("C:repo")).toBe("drive-relative");
    expect(pathSpelling("\\Users\\owner")).toBe("current-drive");
    expect(await refusal(delegatedWorkDir("C:repo", local))).toBe("invalid_work_dir");
    expect(await refusal(delegatedWorkDir("\\Users\\owner", local))).toBe("invalid_work_dir");
    expect(await refusal(delegatedWorkDir("relative/dir", local))).toBe("invalid_work_dir");
    expect(() =>
      captureDelegatedExecutionScope({
        accountId: "a",
        target: { kind: "local", targetId: "l" },
        workDir: "D:x",
      }),
    ).toThrow(/drive-relative/);
  });

  it("host and managed scopes require POSIX paths, for a drive and a UNC share alike (S004-083)", async () => {
    const policies = [
      { kind: "admin", canExecuteHost: true },
      { kind: "scoped", project: { ref: "proj", root: project } },
      { kind: "managed", ref: "m", guestRoot: "/g" },
    ] as const;
    for (const policy of policies)
      for (const cwd of ["C:\\x", "\\\\srv\\share\\x"])
        expect(await refusal(delegatedWorkDir(cwd, policy)), `${policy.kind} ${cwd}`).toBe(
          "invalid_work_dir",
        );
  });

  it("artifact grants use the canonical forward-slash spelling, drive and UNC included (S004-082)", () => {
    for (const ok of ["/a/b", "C:/Users/o/out.json", "//server/share/out.json"])
      expect(isCanonicalArtifactPath(ok)).toBe(true);
    for (const bad of ["C:\\Users\\o", "/a//b", "/a/./b", "/a/../b", "a/b", "/a/b/", "C:out"])
      expect(isCanonicalArtifactPath(bad)).toBe(false);
  });

  it("the parser validates projectRef before workDir, and exact canonical sharedArtifacts (S004-078)", () => {
    // Both are wrong: the projectRef issue is reported (and stops the check) before the workDir issue.
    expect(() =>
      captureDelegatedExecutionScope({
        accountId: "a",
        target: { kind: "host", ref: "p" },
        projectRef: "q",
        workDir: "relative",
      }),
    ).toThrow(/projectRef[^;]*$/);
    // Only the projectRef issue is reported: the workDir check never ran.
    const both = (() => {
      try {
        captureDelegatedExecutionScope({
          accountId: "a",
          target: { kind: "host", ref: "p" },
          projectRef: "q",
          workDir: "relative",
        });
      } catch (e) {
        return e as DelegatedScopeError;
      }
      return undefined;
    })();
    expect((both?.context.issues as { path: string }[] | undefined)?.map((i) => i.path)).toEqual([
      "projectRef",
    ]);
    expect(() =>
      captureDelegatedExecutionScope({
        accountId: "a",
        target: { kind: "local", targetId: "l" },
        sharedArtifacts: ["C:\\out.json"],
      }),
    ).toThrow(/sharedArtifacts\.0/);
  });
});

describe("admission of a stored placement", () => {
  it("a continuation replays the stored cwd, not the parent's current directory (S004-266)", async () => {
    const stored = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({
        accountId: "a",
        target: { kind: "host", ref: "proj" },
        projectRef: "proj",
        workDir: join(project, "src"),
      }),
    );
    const parentNowIn = outside;
    const admitted = await admitStoredWorkDir(stored, (dir) =>
      dir.startsWith(project) ? { ref: "proj", root: project } : undefined,
    );
    expect(admitted).toBe(join(project, "src"));
    expect(admitted).not.toBe(parentNowIn);
  });

  it("channel admission refuses a vanished directory (S004-267)", async () => {
    const gone = join(root, "gone");
    mkdirSync(gone);
    const stored = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({ accountId: "a", target: { kind: "host", ref: null }, workDir: gone }),
    );
    expect(await admitStoredWorkDir(stored)).toBe(gone);
    rmSync(gone, { recursive: true });
    expect(await refusal(admitStoredWorkDir(stored))).toBe("work_dir_unavailable");
  });

  it("channel admission refuses a directory that no longer matches the stored host target (S004-268)", async () => {
    const stored = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({
        accountId: "a",
        target: { kind: "host", ref: "proj" },
        projectRef: "proj",
        workDir: project,
      }),
    );
    expect(await refusal(admitStoredWorkDir(stored, () => ({ ref: "proj-renamed", root: project })))).toBe(
      "work_dir_unavailable",
    );
    expect(await refusal(admitStoredWorkDir(stored, () => undefined))).toBe("work_dir_unavailable");
    expect(await admitStoredWorkDir(stored, () => ({ ref: "proj", root: project }))).toBe(project);
  });
});
