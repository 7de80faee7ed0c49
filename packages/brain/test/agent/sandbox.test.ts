import { execFileSync } from "node:child_process";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { createChildTools, SandboxUnavailableError } from "../../src/agent/index.js";
import { captureDelegatedExecutionScope, parseDelegatedExecutionScope } from "../../src/scope/index.js";

// Every command here runs through the real bwrap the shell tool spawns; nothing is mocked.
const root = realpathSync(mkdtempSync(join(tmpdir(), "crw-sandbox-")));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let n = 0;
function freshDir(name = "w"): string {
  const dir = join(root, `${name}${n++}`);
  mkdirSync(dir);
  return dir;
}

interface Ran {
  readonly ok: boolean;
  readonly output: string;
  readonly error?: Error;
}

function shellTool(dir: string, options: { readOnly?: boolean; shellTimeoutMs?: number } = {}) {
  const scope = parseDelegatedExecutionScope(
    captureDelegatedExecutionScope({ accountId: "acct", target: { kind: "host", ref: "p" }, workDir: dir }),
  );
  const tool = createChildTools({ workDir: dir, scope, shellTimeoutMs: 10_000, ...options }).find(
    (t) => t.name === "shell",
  );
  if (!tool) throw new Error("no shell tool");
  return tool;
}

async function shell(dir: string, command: string, options: { readOnly?: boolean } = {}): Promise<Ran> {
  const tool = shellTool(dir, options);
  try {
    const result = await tool.execute("call", { command });
    const part = result.content[0];
    return { ok: true, output: part?.type === "text" ? part.text : "" };
  } catch (e) {
    const error = e instanceof Error ? e : new Error(String(e));
    return { ok: false, output: error.message, error };
  }
}

function git(cwd: string, ...args: string[]): string {
  return execFileSync("git", ["-c", "user.name=t", "-c", "user.email=t@t", ...args], {
    cwd,
    encoding: "utf8",
  });
}

function repository(): string {
  const repo = freshDir("repo");
  git(repo, "init", "-q", "-b", "main");
  writeFileSync(join(repo, "a.txt"), "one\n");
  mkdirSync(join(repo, "sub"));
  writeFileSync(join(repo, "sub", "s.txt"), "s\n");
  git(repo, "add", ".");
  git(repo, "commit", "-qm", "first");
  return repo;
}

/** Host processes whose command line is exactly `argv` and that still run (zombies do not count). */
function running(argv: string[]): number[] {
  const wanted = `${argv.join("\0")}\0`;
  return readdirSync("/proc")
    .filter((pid) => /^\d+$/.test(pid))
    .filter((pid) => {
      try {
        if (readFileSync(`/proc/${pid}/cmdline`, "utf8") !== wanted) return false;
        return !/^\d+ \(.*\) [ZX]/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
      } catch {
        return false;
      }
    })
    .map(Number);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("the shell sandbox's filesystem", () => {
  it("a write outside the working directory fails and nothing is written", async () => {
    const dir = freshDir();
    const outside = freshDir("outside");
    const probe = `crw-sandbox-probe-${process.pid}-${n}`;
    for (const target of [join(outside, "f"), `/etc/${probe}`, `/usr/${probe}`, `/${probe}`]) {
      const ran = await shell(dir, `echo x > '${target}'`);
      expect(ran.ok, target).toBe(false);
      expect(existsSync(target), target).toBe(false);
    }
    expect(readdirSync(outside)).toEqual([]);
    // /tmp is a private tmpfs (the working directory's parents live there as mount points): writes work
    // inside and vanish with the sandbox.
    for (const target of [join("/tmp", probe), join(root, probe)]) {
      const ran = await shell(dir, `echo x > '${target}' && cat '${target}'`);
      expect(ran, target).toMatchObject({ ok: true, output: "exit code 0\nx\n" });
      expect(existsSync(target), target).toBe(false);
    }
  });

  it("shows /etc (secrets masked) and system directories, but no other host directory", async () => {
    const dir = freshDir();
    const outside = freshDir("outside");
    writeFileSync(join(outside, "secret.txt"), "host secret");
    // /etc is visible read-only: programs need it (alternatives links, passwd, certificates, gitconfig).
    const hostname = await shell(dir, "cat /etc/hostname");
    expect(hostname).toMatchObject({
      ok: true,
      output: `exit code 0\n${readFileSync("/etc/hostname", "utf8")}`,
    });
    // Even a root daemon's sandbox cannot read root's secrets in /etc.
    const shadow = await shell(dir, "cat /etc/shadow");
    expect(shadow.ok).toBe(false);
    expect(shadow.output).not.toContain("root:");
    for (const hidden of ["/root", "/home", "/var/lib", "/run", "/sys", outside]) {
      const ran = await shell(dir, `ls '${hidden}'`);
      expect(ran.ok, hidden).toBe(false);
      expect(ran.output, hidden).toContain("No such file or directory");
    }
    const read = await shell(dir, `cat '${join(outside, "secret.txt")}'`);
    expect(read.ok).toBe(false);
    expect(read.output).not.toContain("host secret");
    // The root holds the system directories, the private /tmp, /dev and /proc: nothing else.
    const top = await shell(dir, "ls -A /");
    expect(top.ok).toBe(true);
    const entries = top.output.split("\n").slice(1).filter(Boolean);
    const allowed = ["bin", "dev", "etc", "lib", "lib64", "opt", "proc", "sbin", "tmp", "usr"];
    expect(entries.filter((e) => !allowed.includes(e))).toEqual([]);
    expect(entries).toEqual(expect.arrayContaining(["usr", "etc", "tmp", "dev", "proc"]));
  });

  it("a read-write turn writes inside the working directory, and the command starts there", async () => {
    const dir = freshDir();
    const ran = await shell(
      dir,
      "pwd && echo x > f && mkdir -p d && echo y > d/g && node -e 'console.log(1+1)'",
    );
    expect(ran).toMatchObject({ ok: true, output: `exit code 0\n${dir}\n2\n` });
    expect(readFileSync(join(dir, "f"), "utf8")).toBe("x\n");
    expect(readFileSync(join(dir, "d", "g"), "utf8")).toBe("y\n");
  });

  it("the command sees a clean environment: HOME is the private /tmp, none of the daemon's variables", async () => {
    const dir = freshDir();
    process.env.CRW_SANDBOX_TEST_SECRET = "s3cret";
    try {
      const ran = await shell(dir, "env; test -e /proc/$$/fd/3 && echo fd3-open || echo fd3-closed");
      expect(ran.ok).toBe(true);
      expect(ran.output).toContain("HOME=/tmp\n");
      expect(ran.output).not.toContain("s3cret");
      // The descriptor that reports the sandbox started is closed before the command runs.
      expect(ran.output).toContain("fd3-closed");
    } finally {
      delete process.env.CRW_SANDBOX_TEST_SECRET;
    }
  });

  it("a read-only turn reads, but every write fails and writes nothing, however it is spelled", async () => {
    const dir = freshDir();
    writeFileSync(join(dir, "a.txt"), "same\n");
    writeFileSync(join(dir, "b.txt"), "same\n");
    const read = await shell(dir, "cat a.txt | wc -l", { readOnly: true });
    expect(read).toMatchObject({ ok: true, output: "exit code 0\n1\n" });
    const writes = [
      "find . -maxdepth 0 -ex''ec touch f '{}' +",
      "find . -maxdepth 0 '-fprint' f",
      "sort --outp=f a.txt",
      "sort -uo f a.txt",
      "git diff --no-index '--output=f' a.txt b.txt",
      "echo x > f",
      "rm a.txt",
      // Nor can the command undo the read-only mount: it holds no capabilities and no user namespace.
      `mount -o remount,bind,rw "$PWD" && echo x > f`,
      `unshare -rm sh -c 'mount -o remount,bind,rw "$PWD" && echo x > f'`,
    ];
    for (const command of writes) {
      const ran = await shell(dir, command, { readOnly: true });
      expect(ran.ok, command).toBe(false);
      expect(readdirSync(dir).sort(), command).toEqual(["a.txt", "b.txt"]);
    }
    // The same spellings do write in a read-write turn: the read-only mount is what stopped them.
    const writable = await shell(dir, "sort -uo f a.txt");
    expect(writable.ok).toBe(true);
    expect(readFileSync(join(dir, "f"), "utf8")).toBe("same\n");
  });
});

describe("the shell sandbox's processes and network", () => {
  let server: Server | undefined;
  afterEach(() => {
    server?.close();
    server = undefined;
  });

  it("has no network: a connection to a server on the host's loopback fails", async () => {
    const dir = freshDir();
    let accepted = 0;
    server = createServer((socket) => {
      accepted++;
      socket.end();
    });
    const port = await new Promise<number>((resolve) => {
      server?.listen(0, "127.0.0.1", () => {
        const address = server?.address();
        resolve(typeof address === "object" && address ? address.port : 0);
      });
    });
    writeFileSync(
      join(dir, "probe.js"),
      `require("node:net").connect(${port}, "127.0.0.1")
        .on("connect", () => { console.log("connected"); process.exit(0); })
        .on("error", (e) => { console.log(e.code); process.exit(3); });`,
    );
    const ran = await shell(dir, "node probe.js");
    expect(ran.ok).toBe(false);
    expect(ran.output).toContain("exit code 3");
    expect(ran.output).toContain("ECONNREFUSED");
    expect(accepted).toBe(0);
  });

  it("a background process a command leaves behind is gone once the call settles", async () => {
    const dir = freshDir();
    const started = Date.now();
    const ran = await shell(
      dir,
      "(while :; do echo x >> marker; sleep 0.05; done) >/dev/null 2>&1 & sleep 7.45 & sleep 0.3; echo left",
    );
    expect(ran).toMatchObject({ ok: true, output: "exit code 0\nleft\n" });
    // `sleep 7.45` kept the output pipes open; the call still settled when the shell exited.
    expect(Date.now() - started).toBeLessThan(7000);
    expect(running(["sleep", "7.45"])).toEqual([]);
    const size = statSync(join(dir, "marker")).size;
    expect(size).toBeGreaterThan(0);
    await sleep(400);
    expect(statSync(join(dir, "marker")).size).toBe(size);
  });

  it("a command killed at its timeout takes its descendants with it", async () => {
    const dir = freshDir();
    // The bound leaves a loaded machine time to start the sandbox and the command before it is reached.
    const run = shellTool(dir, { shellTimeoutMs: 1_500 }).execute("call", {
      command: "sleep 6.55 & echo started > started.txt; wait",
    });
    await expect(run).rejects.toThrow("timed out after 1500 ms");
    expect(existsSync(join(dir, "started.txt"))).toBe(true);
    for (let i = 0; i < 50 && running(["sleep", "6.55"]).length > 0; i++) await sleep(20);
    expect(running(["sleep", "6.55"])).toEqual([]);
  });
});

describe("git inside the shell sandbox", () => {
  it("git status, diff and log work in a repository, from its root and a subdirectory, in any turn", async () => {
    const repo = repository();
    writeFileSync(join(repo, "a.txt"), "two\n");
    for (const [dir, readOnly] of [
      [repo, false],
      [repo, true],
      [join(repo, "sub"), false],
    ] as const) {
      const ran = await shell(dir, "git status --porcelain && git diff --stat && git log --format=%s", {
        readOnly,
      });
      expect(ran.ok, `${dir} ${readOnly}`).toBe(true);
      expect(ran.output).toContain(" M a.txt");
      expect(ran.output).toContain("1 file changed");
      expect(ran.output).toContain("first");
    }
    // From a subdirectory the rest of the working tree is there for Git to read, and only to read.
    const sibling = await shell(join(repo, "sub"), "cat ../a.txt && echo x > ../a.txt");
    expect(sibling.ok).toBe(false);
    expect(sibling.output).toContain("two\n");
    expect(sibling.output).toContain("Read-only file system");
    expect(readFileSync(join(repo, "a.txt"), "utf8")).toBe("two\n");
  });

  it("git status works in a linked worktree, whose working files outside it stay hidden", async () => {
    const repo = repository();
    const worktree = join(freshDir("wt"), "tree");
    git(repo, "worktree", "add", "-q", "-b", "side", worktree);
    writeFileSync(join(worktree, "new.txt"), "n\n");
    for (const readOnly of [false, true]) {
      const ran = await shell(worktree, "git status --porcelain --branch && git log --format=%s", {
        readOnly,
      });
      expect(ran.ok, String(readOnly)).toBe(true);
      expect(ran.output).toContain("## side");
      expect(ran.output).toContain("?? new.txt");
      expect(ran.output).toContain("first");
    }
    // The main working tree's files are not part of what git needs to read the worktree.
    const main = await shell(worktree, `cat '${join(repo, "a.txt")}'`);
    expect(main.ok).toBe(false);
  });

  it("git metadata is read-only even in a read-write turn: hooks and config cannot be planted", async () => {
    const repo = repository();
    const hook = join(repo, ".git", "hooks", "pre-commit");
    const ran = await shell(repo, "echo 'touch /tmp/owned' > .git/hooks/pre-commit");
    expect(ran.ok).toBe(false);
    expect(ran.output).toContain("Read-only file system");
    expect(existsSync(hook)).toBe(false);
    const config = await shell(repo, "git config core.fsmonitor 'touch /tmp/owned'");
    expect(config.ok).toBe(false);
    expect(readFileSync(join(repo, ".git", "config"), "utf8")).not.toContain("fsmonitor");
    // The working files next to it stay writable.
    expect((await shell(repo, "echo three > a.txt")).ok).toBe(true);
  });
});

describe("an unavailable sandbox", () => {
  const saved = process.env.CRW_BWRAP;
  afterEach(() => {
    if (saved === undefined) delete process.env.CRW_BWRAP;
    else process.env.CRW_BWRAP = saved;
  });

  it("a missing bwrap fails the call with a typed error, and nothing runs unsandboxed", async () => {
    const dir = freshDir();
    process.env.CRW_BWRAP = "/nonexistent";
    const ran = await shell(dir, "touch ran");
    expect(ran.ok).toBe(false);
    expect(ran.error).toBeInstanceOf(SandboxUnavailableError);
    expect(ran.error).toMatchObject({
      name: "SandboxUnavailableError",
      code: "bwrap_missing",
      retryable: false,
    });
    expect(ran.output).toContain("apt-get install bubblewrap");
    expect(existsSync(join(dir, "ran"))).toBe(false);
  });

  it("a bwrap that cannot create its namespaces fails the call with a typed error saying why", async () => {
    const dir = freshDir();
    // A real bwrap, started where user namespaces are switched off: it fails before the command runs.
    const wrapper = join(freshDir("bin"), "bwrap");
    writeFileSync(
      wrapper,
      `#!/bin/sh\nexec bwrap --ro-bind / / --dev /dev --proc /proc --unshare-user --disable-userns -- bwrap "$@"\n`,
    );
    chmodSync(wrapper, 0o755);
    process.env.CRW_BWRAP = wrapper;
    const ran = await shell(dir, "touch ran");
    expect(ran.error).toBeInstanceOf(SandboxUnavailableError);
    expect(ran.error).toMatchObject({ code: "namespaces_unavailable" });
    expect(ran.output).toContain("user namespaces");
    expect(existsSync(join(dir, "ran"))).toBe(false);
  });
});
