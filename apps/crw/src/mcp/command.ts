import { resolve } from "node:path";
import { CONNECTION_HELP, connection, inputError, out, parse, parseOrExit } from "../client/common.js";
import { version } from "../version.js";
import { installFor } from "./install.js";
import { DaemonLink } from "./link.js";
import { serveMcp } from "./server.js";

const PREFIX = "crw mcp";

const HELP = `Usage: crw mcp [options]               serve crw's tools to an MCP client over stdio
       crw mcp install codex|claude [options]
                                         write the client's configuration so it starts 'crw mcp'

One MCP connection is one crw session. It is found again by name, so a restarted client finds its session and
the results it has not collected yet. The tools: delegate, continue, read, results, status, workflow_start,
workflow_status, workflow_cancel, land.

Options:
  --session NAME   the session's name (default: the client's working directory)
  --cwd DIR        the session's working directory when it is made (default: where the client runs this)
  --model MODEL    the session's model (default: the daemon's)
  --no-start       do not start the local daemon when none answers on the data directory
${CONNECTION_HELP}

install options:
  --config FILE    codex: the config.toml to change (default: $CODEX_HOME/config.toml or ~/.codex/config.toml);
                   claude: the MCP config file (default: ~/.claude.json, user scope)
  --project        claude: write .mcp.json in the current directory (project scope) instead`;

export async function runMcpCli(args: string[]): Promise<number> {
  const parsed = parseOrExit(PREFIX, () =>
    parse(args, {
      session: { type: "string" },
      cwd: { type: "string" },
      model: { type: "string" },
      "no-start": { type: "boolean" },
      config: { type: "string" },
      project: { type: "boolean" },
    }),
  );
  if (typeof parsed === "number") return parsed;
  const { values, positionals } = parsed;
  if (values.help) {
    out(HELP);
    return 0;
  }
  const [command, target, ...extra] = positionals;
  if (command === "install") {
    if ((target !== "codex" && target !== "claude") || extra.length > 0)
      return inputError(PREFIX, "install needs codex or claude; see 'crw mcp --help'");
    return installFor(target, values);
  }
  if (command !== undefined) return inputError(PREFIX, `unknown command ${command}; see 'crw mcp --help'`);
  const cwd = resolve(String(values.cwd ?? process.cwd()));
  const link = new DaemonLink({
    ...connection(values),
    sessionName: String(values.session ?? `dir:${cwd}`),
    cwd,
    model: values.model as string | undefined,
    startDaemon: values["no-start"] !== true,
    log: (line) => process.stderr.write(`${PREFIX}: ${line}\n`),
  });
  try {
    // Serve at once (clients bound a server's start to seconds; a daemon that must start takes longer) and
    // connect meanwhile: a tool call waits for the connection, and says why when there is none.
    link.session().catch((e) => link.options.log(e instanceof Error ? e.message : String(e)));
    await serveMcp(link, version());
    return 0;
  } catch (e) {
    process.stderr.write(`${PREFIX}: ${e instanceof Error ? e.message : String(e)}\n`);
    return 1;
  } finally {
    link.close();
  }
}
