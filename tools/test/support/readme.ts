import { execFileSync, spawnSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { stripVTControlCharacters } from "node:util";
import { expect } from "vitest";
import type { TestUser } from "../../src/users/index.js";

// The README's commands from a fresh clone, as the two kinds of user that broke them: an ordinary user in
// its own home, and root in a clone under a private (0700) directory. Each runs `npm ci && npm run demo`
// (what the demo shows is checked whole here), `crw daemon start` with the default data directory, and the
// PostgreSQL-backed suite of @crw/db. The two kinds are two test files so that they run side by side: each
// is minutes of installing and building.
const root = resolve(import.meta.dirname, "../../..");
const made: string[] = [];

/** Removes what `removeAfter` was given since the last call (test/setup.ts, after each test file). */
export function removeMade(): void {
  for (const dir of made.splice(0)) rmSync(dir, { recursive: true, force: true });
}

/** Removed when the test file's tests end. */
export function removeAfter(...dirs: string[]): void {
  made.push(...dirs);
}

/** A clone of this checkout whose working tree is this one's (committed or not), owned by `user`. */
export function freshClone(dest: string, user: TestUser | undefined): void {
  execFileSync("git", ["clone", "-q", "--no-checkout", root, dest]);
  const files = execFileSync("git", ["ls-files", "-co", "--exclude-standard", "-z"], {
    cwd: root,
    encoding: "utf8",
  })
    .split("\0")
    .filter((f) => f !== "" && statSync(join(root, f), { throwIfNoEntry: false })?.isFile());
  for (const f of files) {
    mkdirSync(dirname(join(dest, f)), { recursive: true });
    cpSync(join(root, f), join(dest, f));
  }
  if (user) execFileSync("chown", ["-R", `${user.uid}:${user.gid}`, dest]);
}

interface Ran {
  code: number | null;
  out: string;
}

/**
 * npm's download cache for `home`'s user, seeded from this process's own when it has none: which tarballs
 * npm finds on disk is not what these passes prove, and fetching 1.4 GB again for each kind of user cost
 * each pass a minute of waiting on the registry. A copy, not links: the user writes into its cache, and a
 * hard link would hand this process's files to that user.
 */
function seedNpmCache(user: TestUser | undefined, home: string): void {
  const own = join(homedir(), ".npm", "_cacache");
  const theirs = join(home, ".npm", "_cacache");
  if (!existsSync(own) || existsSync(theirs)) return;
  mkdirSync(dirname(theirs), { recursive: true });
  cpSync(own, theirs, { recursive: true });
  if (user) execFileSync("chown", ["-R", `${user.uid}:${user.gid}`, join(home, ".npm")]);
}

/** A command as `user` would run it from a login shell: a plain environment, nothing of this test run's. */
function runAs(
  user: TestUser | undefined,
  home: string,
  cwd: string,
  command: string,
  timeoutMs: number,
): Ran {
  const r = spawnSync("/bin/sh", ["-c", `${command} 2>&1`], {
    cwd,
    encoding: "utf8",
    timeout: timeoutMs,
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      HOME: home,
      USER: user?.name ?? process.env.USER ?? "",
      LOGNAME: user?.name ?? process.env.USER ?? "",
      // Root's server home of this test run (tools/vitest/serverHome.ts): the daemon the README starts puts
      // its cluster there, and it goes with the run instead of staying under /var/lib/crw-postgres.
      ...(process.env.CRW_POSTGRES_HOME && { CRW_POSTGRES_HOME: process.env.CRW_POSTGRES_HOME }),
    },
    ...(user && { uid: user.uid, gid: user.gid }),
  });
  // Colours are for terminals; the assertions read plain text.
  return { code: r.status, out: stripVTControlCharacters(r.stdout) };
}

/**
 * What `npm run demo` shows (its stdout and stderr together): the daemon workflow with an expansion, a
 * delegation and a crw flow run, offline, the agents' changes landed, and the daemon stopped.
 */
function expectDemoOutput(text: string): void {
  expect(text).toMatch(/crw daemon ready at http:\/\/127\.0\.0\.1:\d+/);
  // the workflow: four declared nodes and the one added from inside plan's turn, all succeeded, one summary
  expect(text).toMatch(/Workflow "review-and-document" \([0-9a-f-]+\) completed, run 1\./);
  for (const node of ["plan", "api", "docs", "review", "release-notes"])
    expect(text).toMatch(new RegExp(`^- ${node}: succeeded$`, "m"));
  expect(text.match(/^Workflow "review-and-document"/gm)).toHaveLength(1);
  // the delegation's result, read back from the child
  expect(text).toContain("child session started");
  expect(text).toMatch(/^Three risks: locks, long rewrites, no rollback path\.$/m);
  // every delegated turn ran in a forked runner
  expect(text).toMatch(/sub-agents: [1-9]\d*\/\d+ runners/);
  // agents at work: the isolated child's fix, committed by crw on its branch and landed; the workflow's files
  expect(text).toMatch(/committed on branch crw\/[0-9a-f]{12} at [0-9a-f]{12} \(1 file changed.*calc\.js\)/);
  expect(text).toMatch(/^landed crw\/[0-9a-f]{12} into main at [0-9a-f]{12} \(fast-forward\)/m);
  expect(text).toMatch(/^-export const add = \(a, b\) => a - b;\n\+export const add = \(a, b\) => a \+ b;$/m);
  expect(text).toMatch(
    /^check: landed crw\/[0-9a-f]{8} into main at [0-9a-f]{12} \(fast-forward\): CHANGELOG\.md, NOTES\.md$/m,
  );
  expect(text).toMatch(/^ CHANGELOG\.md \| 1 \+\n NOTES\.md {5}\| 1 \+$/m);
  expect(text).toMatch(/\$ git status --short\n\(clean\)/);
  expect(text).toMatch(/Workflow "notes-for-the-fix" \([0-9a-f-]+\) completed/);
  expect(text).toMatch(/^- check: succeeded\n {2}Both files are there and the test passes\.$/m);
  expect(text).toMatch(/\$ node test\.js\nPASS/);
  // crw flow on the local backend
  expect(text).toMatch(/^run release-notes-\S+ \(release-notes\): completed$/m);
  for (const call of ["plan.1", "draft.1", "draft.2", "write.1", "review.1"])
    expect(text).toMatch(new RegExp(`^  ${call.replace(".", "\\.")}\\s+\\w+\\s+completed`, "m"));
  expect(text).toMatch(/crw daemon \(pid \d+\) stopped/);
}

export const mode = (path: string) => statSync(path).mode & 0o777;
const serverUid = (dataDir: string) => {
  const pid = Number(readFileSync(join(dataDir, "postgres", "postmaster.pid"), "utf8").split("\n")[0]);
  return statSync(`/proc/${pid}`).uid;
};

/** The README's two commands (the main job and the PostgreSQL tests) and the daemon's first command. */
export function readmeCommands(user: TestUser | undefined, home: string, clone: string) {
  seedNpmCache(user, home);
  const demo = runAs(user, home, clone, "npm ci --no-audit --no-fund && npm run demo", 600_000);
  expect(demo.code, demo.out.slice(-4000)).toBe(0);
  expectDemoOutput(demo.out);

  const crw = `node ${join(clone, "apps/crw/bin/crw.mjs")}`;
  const start = runAs(user, home, home, `${crw} daemon start --port 0`, 120_000);
  expect(start.code, start.out).toBe(0);
  const dataDir = join(home, ".crw", "daemon");
  expect(start.out).toContain(join(dataDir, "daemon.log"));
  try {
    expect(serverUid(dataDir)).not.toBe(0);
    expect(mode(dataDir)).toBe(0o700);
    expect(mode(join(home, ".crw")) & 0o077).toBe(0);
    expect(runAs(user, home, home, `${crw} daemon status`, 30_000).out).toMatch(/: ok$/m);
  } finally {
    const stop = runAs(user, home, home, `${crw} daemon stop`, 90_000);
    expect(stop.code, stop.out).toBe(0);
  }

  const tests = runAs(user, home, join(clone, "packages/db"), "npx vitest run", 300_000);
  expect(tests.code, tests.out.slice(-4000)).toBe(0);
  expect(tests.out).toMatch(/Tests\s+\d+ passed/);
}
