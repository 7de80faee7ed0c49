import { spawn } from "node:child_process";
import { closeSync, fchmodSync, fstatSync, mkdirSync, openSync, readFileSync } from "node:fs";
import { get as httpGet } from "node:http";
import { join } from "node:path";
import { parseArgs } from "node:util";

const HELP = `Usage: crw daemon <command> [options]

Commands:
  start    start the daemon in the background and wait until it is ready
  run      run the daemon in the foreground (logs to stdout as JSON lines)
  stop     stop the running daemon gracefully and wait for it to exit
  status   print the running daemon's health

Options:
  --data-dir DIR   the daemon's data directory (default: $CRW_DAEMON_DIR, $CRW_HOME/daemon or ~/.crw/daemon)
  --config FILE    a JSON config file (default: <data-dir>/daemon.json when present)
  --port N         API port (default 7420; 0 picks a free one)
  --json           machine-readable output (start, stop, status)

Environment: DATABASE_URL uses that PostgreSQL instead of the embedded one in the data directory.`;

const READY_TIMEOUT_MS = 90_000;
const STOP_TIMEOUT_MS = 60_000;
/** How long a recorded daemon gets to answer /health before start and status call it not answering. */
const HEALTH_TIMEOUT_MS = 5_000;

interface Flags {
  dataDir?: string;
  config?: string;
  port?: number;
  json: boolean;
}

const out = (s: string) => process.stdout.write(`${s}\n`);
const err = (s: string) => process.stderr.write(`crw daemon: ${s}\n`);

function parse(args: string[]): { command: string | undefined; flags: Flags } | number {
  let parsed: ReturnType<
    typeof parseArgs<{ options: Record<string, { type: "string" | "boolean" }>; allowPositionals: true }>
  >;
  try {
    parsed = parseArgs({
      args,
      allowPositionals: true,
      options: {
        "data-dir": { type: "string" },
        config: { type: "string" },
        port: { type: "string" },
        json: { type: "boolean" },
        help: { type: "boolean" },
      },
    });
  } catch (e) {
    err(`${e instanceof Error ? e.message : String(e)}; see 'crw daemon --help'`);
    return 2;
  }
  const v = parsed.values as Record<string, string | boolean | undefined>;
  if (v.help || parsed.positionals.length === 0) {
    out(HELP);
    return v.help ? 0 : 2;
  }
  let port: number | undefined;
  if (typeof v.port === "string") {
    port = Number(v.port);
    if (!Number.isInteger(port) || port < 0 || port > 65_535) {
      err(`--port must be a whole number 0..65535, not '${v.port}'`);
      return 2;
    }
  }
  if (parsed.positionals.length > 1) {
    err(`unexpected '${parsed.positionals[1]}'; see 'crw daemon --help'`);
    return 2;
  }
  return {
    command: parsed.positionals[0],
    flags: {
      dataDir: v["data-dir"] as string | undefined,
      config: v.config as string | undefined,
      port,
      json: v.json === true,
    },
  };
}

export async function runDaemonCli(args: string[]): Promise<number> {
  const p = parse(args);
  if (typeof p === "number") return p;
  // The daemon's control entry: start, stop and status never load the daemon they start or ask after.
  const daemon = await import("@crw/daemon/control");
  let config: DaemonConfig;
  try {
    config = daemon.loadConfig({
      file: p.flags.config,
      overrides: {
        ...(p.flags.dataDir ? { dataDir: p.flags.dataDir } : {}),
        ...(p.flags.port !== undefined ? { port: p.flags.port } : {}),
      },
    });
  } catch (e) {
    err(e instanceof Error ? e.message : String(e));
    return 2;
  }
  switch (p.command) {
    case "run":
      return runForeground(config);
    case "start":
      return start(daemon, config, p.flags, args);
    case "stop":
      return stop(daemon, config, p.flags);
    case "status":
      return status(daemon, config, p.flags);
    default:
      err(`unknown command '${p.command}'; see 'crw daemon --help'`);
      return 2;
  }
}

type DaemonModule = typeof import("@crw/daemon/control");
type DaemonConfig = import("@crw/daemon/control").DaemonConfig;

async function runForeground(config: DaemonConfig): Promise<number> {
  try {
    const { startDaemon } = await import("@crw/daemon");
    const d = await startDaemon(config, { handleSignals: true });
    // A failed restart checkpoint (journal writes that could not commit) is a failed exit.
    const outcome = await d.stopped;
    return outcome.checkpoint === "failed" ? 1 : 0;
  } catch (e) {
    err(e instanceof Error ? e.message : String(e));
    return 1;
  }
}

/**
 * The daemon's health document. Without a token /health is liveness only; the owner's token (read from the
 * data directory, when this user can read it) gets the whole document.
 */
async function fetchHealth(
  url: string,
  dataDir: string,
  timeoutMs = HEALTH_TIMEOUT_MS,
): Promise<Record<string, unknown> | undefined> {
  let token = "";
  try {
    token = readFileSync(join(dataDir, "owner.token"), "utf8").trim();
  } catch {
    // liveness only
  }
  try {
    return (await getJson(
      `${url}/health`,
      token ? { authorization: `Bearer ${token}` } : {},
      timeoutMs,
    )) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

/**
 * A GET of a JSON document, bounded by `timeoutMs` as a whole. node:http rather than fetch: a command's first
 * fetch loads fetch's HTTP client, about 60 ms of CPU more than the whole GET costs here.
 */
function getJson(url: string, headers: Record<string, string>, timeoutMs: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const req = httpGet(url, { headers, signal: AbortSignal.timeout(timeoutMs) }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", reject);
      res.on("end", () => {
        try {
          resolve(JSON.parse(Buffer.concat(chunks).toString("utf8")));
        } catch (e) {
          reject(e);
        }
      });
    });
    req.on("error", reject);
  });
}

async function start(
  daemon: DaemonModule,
  config: DaemonConfig,
  flags: Flags,
  args: string[],
): Promise<number> {
  const logFile = join(config.dataDir, "daemon.log");
  const recorded = await readRecorded(daemon, config.dataDir);
  if (recorded?.liveness === "alive") return answerRunning(recorded, config.dataDir, logFile, flags);
  // A dead recorded daemon left its lock and state file: the new daemon takes the lock over.
  if (recorded) err(`the recorded daemon ${deadReason(recorded)}; starting a new one`);
  mkdirSync(config.dataDir, { recursive: true, mode: 0o700 });
  // daemon.log holds model output: the user's alone, also when an older crw made it wider (fchmod).
  const fd = openSync(logFile, "a", 0o600);
  fchmodSync(fd, 0o600);
  const logStart = fstatSync(fd).size;
  const runArgs = args.map((a) => (a === "start" ? "run" : a));
  const child = spawn(process.execPath, [process.argv[1] as string, "daemon", ...runArgs], {
    detached: true,
    stdio: ["ignore", fd, fd],
    env: process.env,
  });
  closeSync(fd);
  let exited: number | null = null;
  let spawnError: Error | undefined;
  child.once("exit", (code) => {
    exited = code ?? 1;
  });
  child.once("error", (e) => {
    spawnError = e;
  });
  child.unref();
  const until = Date.now() + READY_TIMEOUT_MS;
  while (Date.now() < until) {
    if (spawnError) {
      err(`the daemon process could not start: ${spawnError.message}`);
      return 1;
    }
    if (exited !== null) {
      err(
        `the daemon exited during start (code ${exited}): ${whyItExited(logFile, logStart)}\nsee ${logFile}`,
      );
      return 1;
    }
    const state = await daemon.readState(config.dataDir);
    if (state && state.pid === child.pid) {
      const health = await fetchHealth(state.url, config.dataDir);
      if (health?.status === "ok") {
        if (flags.json) out(JSON.stringify({ ok: true, ...state, log: logFile }));
        else
          out(
            `crw daemon ready at ${state.url} (pid ${state.pid}); logs in ${logFile}; stop it with 'crw daemon stop'`,
          );
        return 0;
      }
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  err(`the daemon did not become ready in ${READY_TIMEOUT_MS / 1000} s; see ${logFile}`);
  return 1;
}

type RecordedDaemon = NonNullable<Awaited<ReturnType<typeof readRecorded>>>;
const readRecorded = (daemon: DaemonModule, dataDir: string) =>
  daemon.readState(dataDir, { includeDead: true });

/** Why a recorded daemon no longer runs, in words (its liveness is not "alive"). */
function deadReason(recorded: RecordedDaemon): string {
  switch (recorded.liveness) {
    case "zombie":
      return `(pid ${recorded.pid}) is a zombie: it exited but its parent has not reaped it`;
    case "reused":
      return `(pid ${recorded.pid}) is gone: that pid now belongs to another process`;
    default:
      return `(pid ${recorded.pid}) is gone: it exited without cleaning up`;
  }
}

/**
 * Start found a live process recorded as the daemon: it is "already running" only when it answers /health.
 * A process that does not answer may be stuck or stopping; starting a second daemon would fail on its lock,
 * so the user is told what to do instead.
 */
async function answerRunning(
  running: RecordedDaemon,
  dataDir: string,
  logFile: string,
  flags: Flags,
): Promise<number> {
  const health = await fetchHealth(running.url, dataDir);
  if (typeof health?.status === "string") {
    // An answer with another status (a database down, a stop under way) is still a running daemon.
    const note =
      health.status === "ok" ? "" : ` (status '${String(health.status)}'; see 'crw daemon status')`;
    if (flags.json) out(JSON.stringify({ ok: true, already: true, ...running, status: health.status }));
    else out(`crw daemon already running (pid ${running.pid}) at ${running.url}${note}`);
    return 0;
  }
  err(
    `a daemon process (pid ${running.pid}) runs on ${dataDir} but does not answer /health at ${running.url} within ${HEALTH_TIMEOUT_MS / 1000} s: it may be stuck, or still stopping. See ${logFile}; stop it with 'crw daemon stop${flags.dataDir ? ` --data-dir ${dataDir}` : ""}' (or 'kill ${running.pid}' if that does not end it), then run 'crw daemon start' again`,
  );
  return 1;
}

/**
 * What the daemon said before it exited, from the part of its log this start wrote: its own error lines
 * (the foreground entry prints a failed start's message), else the last structured entries.
 */
function whyItExited(logFile: string, from: number): string {
  let text: string;
  try {
    text = readFileSync(logFile).subarray(from).toString("utf8");
  } catch {
    return "its log cannot be read";
  }
  const lines = text.split("\n").filter((l) => l.trim() !== "");
  const plain = lines.filter((l) => !l.startsWith("{"));
  const shown = (plain.length > 0 ? plain : lines).slice(-20);
  return shown.length > 0 ? shown.join("\n") : "it wrote nothing";
}

async function stop(daemon: DaemonModule, config: DaemonConfig, flags: Flags): Promise<number> {
  const state = await daemon.readState(config.dataDir);
  if (!state) {
    if (flags.json) out(JSON.stringify({ ok: true, running: false }));
    else out(`no daemon runs on ${config.dataDir}`);
    return 0;
  }
  process.kill(state.pid, "SIGTERM");
  const until = Date.now() + STOP_TIMEOUT_MS;
  // Start time too: in a container whose init does not reap, the stopped daemon stays a zombie.
  while (daemon.processAlive(state.pid, state.processStartTime)) {
    if (Date.now() > until) {
      err(`pid ${state.pid} did not exit within ${STOP_TIMEOUT_MS / 1000} s; it may still be draining`);
      return 1;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  if (flags.json) out(JSON.stringify({ ok: true, stopped: state.pid }));
  else out(`crw daemon (pid ${state.pid}) stopped`);
  return 0;
}

async function status(daemon: DaemonModule, config: DaemonConfig, flags: Flags): Promise<number> {
  const recorded = await readRecorded(daemon, config.dataDir);
  const state = recorded?.liveness === "alive" ? recorded : undefined;
  const dead = recorded && !state ? recorded : undefined;
  const health = state ? await fetchHealth(state.url, config.dataDir) : undefined;
  if (flags.json) {
    const was = dead ? { recorded: { pid: dead.pid, url: dead.url, liveness: dead.liveness } } : {};
    out(JSON.stringify({ running: Boolean(state), ...(state ?? was), health: health ?? null }));
  } else if (dead)
    out(
      `no daemon runs on ${config.dataDir}: the recorded daemon ${deadReason(dead)}; start one with 'crw daemon start'`,
    );
  else if (!state) out(`no daemon runs on ${config.dataDir}; start one with 'crw daemon start'`);
  else {
    out(`crw daemon at ${state.url} (pid ${state.pid}): ${health ? String(health.status) : "not answering"}`);
    if (health) for (const line of healthLines(health)) out(`  ${line}`);
    else
      out(
        `  the process runs but /health did not answer within ${HEALTH_TIMEOUT_MS / 1000} s; see ${join(config.dataDir, "daemon.log")}`,
      );
  }
  return state && health?.status === "ok" ? 0 : 1;
}

/** The human summary of /health: runners, queue, recovery, MCP servers and alerts. */
function healthLines(health: Record<string, unknown>): string[] {
  const lines: string[] = [];
  const db = health.database as
    | { kind: string; ok: boolean; error?: string | null; since?: string; losses?: number; restarts?: number }
    | undefined;
  if (db)
    lines.push(
      db.ok
        ? `database: ${db.kind}, answering${db.losses ? ` (lost ${db.losses} time${db.losses === 1 ? "" : "s"}, started again ${db.restarts ?? 0})` : ""}`
        : `database: ${db.kind}, NOT answering${db.since ? ` since ${db.since}` : ""}: ${db.error ?? "unknown"}; ${db.kind === "external" ? "the daemon retries it" : "the daemon starts it again"} and recovers its work when it answers`,
    );
  const takeover = health.takeover as
    | {
        sweepMs: number;
        lastTakeoverAt: string | null;
        delegations: { continued: number };
        workflows: { resumed: number };
      }
    | null
    | undefined;
  if (takeover && takeover.sweepMs > 0)
    lines.push(
      `takeover: checks every ${takeover.sweepMs} ms for work of daemons that died; ${takeover.delegations.continued} calls continued, ${takeover.workflows.resumed} workflows resumed${takeover.lastTakeoverAt ? `, last at ${takeover.lastTakeoverAt}` : ""}`,
    );
  const pool = health.pool as
    | {
        mode: string;
        runners: unknown[];
        maxRunners: number;
        queued: number;
        turns: number;
        spawnFailure: { category: string } | null;
      }
    | undefined;
  if (pool)
    lines.push(
      `sub-agents: ${pool.mode === "runner" ? `${pool.runners.length}/${pool.maxRunners} runners` : "in the daemon"}, ${pool.turns} turns running, ${pool.queued} queued${pool.spawnFailure ? `, runner startup failed (${pool.spawnFailure.category})` : ""}`,
    );
  const recovery = health.recovery as
    | {
        finishedAt: string | null;
        delegations: { continued: unknown[]; terminalized: unknown[]; failed: unknown[] } | null;
        workflows: { resumed: unknown[]; invalid: unknown[] } | null;
      }
    | null
    | undefined;
  if (recovery?.delegations && recovery.workflows)
    lines.push(
      `boot recovery: ${recovery.delegations.continued.length} calls continued, ${recovery.delegations.terminalized.length + recovery.delegations.failed.length} ended with an error result, ${recovery.workflows.resumed.length} workflows resumed, ${recovery.workflows.invalid.length} invalid`,
    );
  const processes = health.processes as { started: number; exited: number } | undefined;
  const executions = health.executions as { location: string; state?: string }[] | undefined;
  const count = (state: string) =>
    (executions ?? []).filter((e) => e.location === "runner" && e.state === state).length;
  if (processes && executions)
    lines.push(
      `runner processes: ${processes.started} started, ${processes.exited} exited; sessions in runners: ${count("running")} running, ${count("queued")} queued, ${count("idle")} idle; ${executions.filter((e) => e.location === "in-process").length} running in the daemon`,
    );
  const usage = health.providerUsage as
    | { responses: number; input: number; output: number; totalTokens: number }
    | undefined;
  if (usage)
    lines.push(
      `provider usage: ${usage.responses} responses, ${usage.input} input / ${usage.output} output tokens`,
    );
  const mcp = health.mcp as
    | { servers: { name: string; tools: number; running: boolean; state?: string; lastError?: string }[] }
    | undefined;
  if (mcp)
    lines.push(
      `MCP servers: ${
        mcp.servers.length === 0
          ? "none configured"
          : mcp.servers
              .map(
                (s) =>
                  `${s.name} (${s.tools} tool${s.tools === 1 ? "" : "s"}${s.running ? "" : `, ${s.state ?? "stopped"}${s.state === "failed" && s.lastError ? `: ${s.lastError.split("\n")[0]?.slice(0, 120)}` : ""}`})`,
              )
              .join(", ")
      }`,
    );
  for (const a of (health.alerts as { severity: string; text: { en?: string } }[] | undefined) ?? [])
    lines.push(`${a.severity}: ${a.text.en ?? ""}`);
  return lines;
}
