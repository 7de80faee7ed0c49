import { resolve } from "node:path";
import { CONNECTION_HELP, inputError, out, parse, parseOrExit, withClient } from "./common.js";

const HELP = `Usage: crw project <command> [options]

Commands:
  add DIR [--name N] [--account A]   register DIR as a project (name: its directory name) and grant it to
                                     account A (a name or id); accounts other than the owner and
                                     administrators may only work inside projects granted to them
  list                               the registered projects and the accounts granted each

${CONNECTION_HELP}`;

const PREFIX = "crw project";

interface ProjectView {
  name: string;
  root: string;
  accounts: string[];
}

export async function runProjectCli(args: string[]): Promise<number> {
  const parsed = parseOrExit(PREFIX, () =>
    parse(args, { name: { type: "string" }, account: { type: "string" } }),
  );
  if (typeof parsed === "number") return parsed;
  const { values, positionals } = parsed;
  const [command, dir, extra] = positionals;
  if (values.help || !command) {
    out(HELP);
    return values.help ? 0 : 2;
  }
  if (extra) return inputError(PREFIX, `unexpected '${extra}'; see 'crw project --help'`);
  const json = values.json === true;
  switch (command) {
    case "add":
      if (!dir) return inputError(PREFIX, "add needs DIR; see 'crw project --help'");
      return withClient(PREFIX, values, async (client) => {
        const p = await client.call<ProjectView>("project.add", {
          path: resolve(dir),
          ...(values.name ? { name: values.name } : {}),
          ...(values.account ? { account: values.account } : {}),
        });
        out(json ? JSON.stringify({ ok: true, ...p }) : `project ${p.name}: ${p.root}`);
        return 0;
      });
    case "list":
      return withClient(PREFIX, values, async (client) => {
        const r = await client.call<{ projects: ProjectView[] }>("project.list", {});
        if (json) out(JSON.stringify({ ok: true, ...r }));
        else if (r.projects.length === 0) out("no projects; register one with 'crw project add DIR'");
        else
          for (const p of r.projects)
            out(`${p.name.padEnd(20)} ${p.root}${p.accounts.length ? `  (${p.accounts.join(", ")})` : ""}`);
        return 0;
      });
    default:
      return inputError(PREFIX, `unknown command '${command}'; see 'crw project --help'`);
  }
}
