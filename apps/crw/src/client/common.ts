import { parseArgs } from "node:util";
import { ClientError, type ConnectOptions, DaemonClient } from "./connection.js";

export const out = (s: string) => process.stdout.write(`${s}\n`);

export const CONNECTION_OPTIONS = {
  "data-dir": { type: "string" },
  url: { type: "string" },
  token: { type: "string" },
  json: { type: "boolean" },
  help: { type: "boolean" },
} as const;

export const CONNECTION_HELP = `Connection:
  --data-dir DIR   the daemon's data directory (default: $CRW_DAEMON_DIR, $CRW_HOME/daemon or ~/.crw/daemon);
                   its owner.token authenticates
  --url URL[,URL…] a daemon's URL instead (http://host:port), with --token or $CRW_TOKEN; several daemons of
                   one database, comma-separated: the first that answers is used, and a command that
                   follows (tap, workflow run/follow) reconnects to any of them when its connection ends
  --json           machine-readable output (one JSON document; notifications as JSON lines before it)`;

export type Options = Record<string, string | boolean | undefined>;

/** Parses a command line: a typed input error (exit 2) for unknown options. */
export function parse(
  args: string[],
  extra: Record<string, { type: "string" | "boolean" }>,
): { values: Options; positionals: string[] } {
  try {
    const parsed = parseArgs({ args, allowPositionals: true, options: { ...CONNECTION_OPTIONS, ...extra } });
    return { values: parsed.values as Options, positionals: parsed.positionals };
  } catch (e) {
    throw new ClientError(`${e instanceof Error ? e.message : String(e)}; see --help`, "invalid_input", 2);
  }
}

export function connection(values: Options): ConnectOptions {
  return {
    dataDir: values["data-dir"] as string | undefined,
    url: values.url as string | undefined,
    token: values.token as string | undefined,
  };
}

/**
 * Runs one client command: connects, runs, closes; a ClientError prints its message (with what to do)
 * and exits with its code; anything else exits 1.
 */
export async function withClient(
  prefix: string,
  values: Options,
  body: (client: DaemonClient) => Promise<number>,
): Promise<number> {
  let client: DaemonClient | undefined;
  try {
    client = await DaemonClient.connect(connection(values));
    return await body(client);
  } catch (e) {
    const err = e instanceof Error ? e : new Error(String(e));
    const code = err instanceof ClientError ? err.code : "error";
    if (values.json) out(JSON.stringify({ ok: false, error: { code, message: err.message } }));
    else process.stderr.write(`${prefix}: ${err.message}\n`);
    return err instanceof ClientError ? err.exitCode : 1;
  } finally {
    client?.close();
  }
}

/** How long a following command tries to reconnect once its connection ended. */
const RECONNECT_MS = 60_000;

/**
 * Runs a command that follows something (a tap, a workflow): when its connection ends (a daemon stopped
 * or died), it connects again, to the same daemon or another of `--url`'s, and runs `body` again with the
 * new connection; `body` picks up where it was (its own state). Bounded: past RECONNECT_MS without a
 * daemon it fails as any command does.
 */
export async function withFollow(
  prefix: string,
  values: Options,
  body: (client: DaemonClient) => Promise<number>,
  /** The connection has just ended (the caller's own): wait for a daemon before the first try. */
  afterLoss = false,
): Promise<number> {
  if (afterLoss && !(await reconnectable(values))) {
    process.stderr.write(`${prefix}: no daemon answered within ${RECONNECT_MS / 1000} s\n`);
    return 1;
  }
  for (;;) {
    let lost = false;
    const code = await withClient(prefix, values, async (client) => {
      try {
        return await body(client);
      } catch (e) {
        if (!(e instanceof ClientError) || e.code !== "connection_closed") throw e;
        lost = true;
        return 1;
      }
    });
    if (!lost) return code;
    process.stderr.write(`${prefix}: the connection ended; connecting again\n`);
    if (!(await reconnectable(values))) {
      process.stderr.write(`${prefix}: no daemon answered within ${RECONNECT_MS / 1000} s\n`);
      return 1;
    }
  }
}

/** Waits, with a growing backoff, until some daemon of the options accepts a connection. */
async function reconnectable(values: Options): Promise<boolean> {
  const until = Date.now() + RECONNECT_MS;
  for (let delay = 100; Date.now() < until; delay = Math.min(delay * 2, 2_000)) {
    await new Promise((r) => setTimeout(r, delay));
    try {
      (await DaemonClient.connect(connection(values))).close();
      return true;
    } catch {
      // not yet
    }
  }
  return false;
}

export function inputError(prefix: string, message: string): number {
  process.stderr.write(`${prefix}: ${message}\n`);
  return 2;
}

/** Runs a parse; an input error is printed and becomes exit code 2. */
export function parseOrExit<T>(prefix: string, run: () => T): T | number {
  try {
    return run();
  } catch (e) {
    if (e instanceof ClientError) return inputError(prefix, e.message);
    throw e;
  }
}
