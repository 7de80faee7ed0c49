import { type ChildProcess, execFile, spawn } from "node:child_process";
import {
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { type ModelReply, type ModelRequest, type ModelServer, startModelServer } from "@crw/tools/models";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * Following across a daemon's death: two daemons (`crw daemon start`) on one PostgreSQL; `crw tap` and
 * `crw workflow follow` are given both URLs. Daemon A, which runs the work, is SIGKILLed; the commands
 * connect again to B, which has taken the work over, and end as if nothing happened: every message shown
 * once, the workflow's summary printed, exit 0.
 */
const run = promisify(execFile);
const bin = resolve(import.meta.dirname, "../bin/crw.mjs");
const root = mkdtempSync(join(tmpdir(), "crw-reconnect-"));
const dirA = join(root, "a");
const dirB = join(root, "b");
const KEY = "CRW_RECONNECT_TEST_KEY";
let models: ModelServer;
let release: () => void = () => {};
const released = new Promise<void>((r) => {
  release = r;
});
const seen = new Set<string>();

async function answer(request: ModelRequest): Promise<ModelReply> {
  const text = request.userTexts.join("\n");
  if (text.includes("[delegation result for call") || text.includes("[workflow summary"))
    return { text: "the parent read its results" };
  const tag = /(CHILD-\d+|NODE-\w+)/.exec(text)?.[1];
  if (!tag) return { text: "noted" };
  seen.add(tag);
  await released;
  return { text: `${tag} finished` };
}

const env = (databaseUrl?: string): NodeJS.ProcessEnv => {
  const e: NodeJS.ProcessEnv = {
    ...process.env,
    CRW_MODEL: "openai-completions:loopback",
    CRW_MODEL_BASE_URL: models.openaiBaseUrl,
    CRW_MODEL_API_KEY_ENV: KEY,
    [KEY]: "secret",
  };
  delete e.DATABASE_URL;
  if (databaseUrl) e.DATABASE_URL = databaseUrl;
  return e;
};

async function crw(args: string[], e: NodeJS.ProcessEnv) {
  try {
    const { stdout, stderr } = await run(process.execPath, [bin, ...args], { env: e, timeout: 120_000 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const x = err as { code: number; stdout: string; stderr: string };
    return { code: x.code, stdout: x.stdout, stderr: x.stderr };
  }
}

const stateOf = (dir: string) =>
  JSON.parse(readFileSync(join(dir, "daemon.state.json"), "utf8")) as { url: string; pid: number };

/** A command running in the background: its output so far and its exit. */
function background(args: string[], e: NodeJS.ProcessEnv) {
  const child: ChildProcess = spawn(process.execPath, [bin, ...args], {
    env: e,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout?.on("data", (d) => {
    stdout += d.toString();
  });
  child.stderr?.on("data", (d) => {
    stderr += d.toString();
  });
  const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  return { child, exited, out: () => stdout, err: () => stderr };
}

const waitFor = async (check: () => boolean, what: string, ms = 30_000) => {
  const until = Date.now() + ms;
  while (!check()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
};

/** Whether process `pid` holds an established TCP connection to `port` on this machine (Linux /proc). */
function connectedTo(pid: number | undefined, port: number): boolean {
  if (pid === undefined) return false;
  const inodes = new Set<string>();
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    if (!existsSync(table)) continue;
    for (const line of readFileSync(table, "utf8").split("\n").slice(1)) {
      const f = line.trim().split(/\s+/);
      // remote address as hex ip:port, state 01 = established, inode in the tenth column
      if (f[3] === "01" && Number.parseInt(f[2]?.split(":")[1] ?? "", 16) === port && f[9]) inodes.add(f[9]);
    }
  }
  try {
    return readdirSync(`/proc/${pid}/fd`).some((fd) => {
      const link = readlinkSync(`/proc/${pid}/fd/${fd}`, { encoding: "utf8" });
      return inodes.has(/^socket:\[(\d+)\]$/.exec(link)?.[1] ?? "");
    });
  } catch {
    return false;
  }
}

let urls = "";
let token = "";

beforeAll(async () => {
  models = await startModelServer(answer);
  const a = await crw(["daemon", "start", "--data-dir", dirA, "--port", "0"], env());
  expect(a.code, a.stderr).toBe(0);
  const pgData = join(dirA, "postgres");
  const port = Number(readFileSync(join(pgData, "postmaster.pid"), "utf8").split("\n")[3]);
  const password = readFileSync(join(dirA, "postgres.password"), "utf8").trim();
  const url = `postgres://crw:${encodeURIComponent(password)}@127.0.0.1:${port}/crw`;
  const b = await crw(["daemon", "start", "--data-dir", dirB, "--port", "0"], env(url));
  expect(b.code, b.stderr).toBe(0);
  urls = `${stateOf(dirA).url},${stateOf(dirB).url}`;
  token = readFileSync(join(dirA, "owner.token"), "utf8").trim();
}, 120_000);

afterAll(async () => {
  release();
  await crw(["daemon", "stop", "--data-dir", dirB], env());
  await crw(["daemon", "stop", "--data-dir", dirA], env());
  // A was SIGKILLed: the embedded PostgreSQL it ran is still up
  try {
    process.kill(
      Number(readFileSync(join(dirA, "postgres", "postmaster.pid"), "utf8").split("\n")[0]),
      "SIGINT",
    );
  } catch {}
  await models?.close();
  rmSync(root, { recursive: true, force: true });
}, 120_000);

describe("following across a daemon's death", () => {
  it("tap and workflow follow connect again to the other daemon, show every message once and end with exit 0", async () => {
    const at = ["--url", urls, "--token", token];
    const created = await crw(["session", "create", ...at], env());
    expect(created.code, created.stderr).toBe(0);
    const session = created.stdout.trim();
    const bg = await crw(
      ["session", "delegate", session, "CHILD-1: do the work", "--background", ...at],
      env(),
    );
    expect(bg.code, bg.stderr).toBe(0);
    const wf = join(root, "wf.json");
    writeFileSync(wf, JSON.stringify({ name: "follow", nodes: [{ id: "one", task: "NODE-one: work" }] }));
    const started = await crw(["workflow", "run", wf, "--session", session, "--detach", ...at], env());
    expect(started.code, started.stderr).toBe(0);
    const workflowId = started.stdout.trim();
    await waitFor(() => seen.has("CHILD-1") && seen.has("NODE-one"), "both turns at the model");

    const tap = background(["tap", session, "--until-idle", ...at], env());
    const follow = background(["workflow", "follow", workflowId, ...at], env());
    // both are connected (to A, the first URL) before A dies: seen in the kernel's table of connections
    const portA = Number(new URL(stateOf(dirA).url).port);
    await waitFor(
      () => connectedTo(tap.child.pid, portA) && connectedTo(follow.child.pid, portA),
      "the tap and the follow connected to the first daemon",
    );
    expect(tap.child.exitCode).toBeNull();
    expect(follow.child.exitCode).toBeNull();
    const portB = Number(new URL(stateOf(dirB).url).port);
    process.kill(stateOf(dirA).pid, "SIGKILL");
    // A tap whose stream was live on A tells of connecting again; one whose connection was still in its
    // handshake when A died (nothing tells the two apart from outside: the session's journal is empty until
    // the model answers) goes on to B as its first connection
    await waitFor(
      () => tap.err().includes("connecting again") || connectedTo(tap.child.pid, portB),
      "the tap to go on to the other daemon",
      20_000,
    );
    release();
    expect(await follow.exited, follow.err()).toBe(0);
    expect(follow.out()).toMatch(/NODE-one finished|one/);
    expect(await tap.exited, tap.err()).toBe(0);
    // every journal message shown once, across the two connections
    const lines = tap
      .out()
      .split("\n")
      .filter((l) => /^\s*\d+\s/.test(l));
    const seqs = lines.map((l) => Number(l.trim().split(/\s+/)[0]));
    expect(new Set(seqs).size).toBe(seqs.length);
    expect(tap.out()).toMatch(/the parent read its results/);
  }, 120_000);
});
