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
  --url URL        a daemon's URL instead (http://host:port), with --token or $CRW_TOKEN
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
