import { readFileSync } from "node:fs";
import { isAbsolute, resolve } from "node:path";
import { parseArgs } from "node:util";
import { stateDirFrom } from "../run/paths.js";
import { asError } from "./errors.js";
import { runPreToolUse } from "./hook.js";

/**
 * `crw flow hook pre-tool-use [--state DIR]`: the PreToolUse hook (stdin JSON in, hookSpecificOutput JSON
 * out). `crw flow hook install [--codex-home DIR] [--state DIR] [--codex BIN] [--cwd DIR] [--json]`:
 * installs and trusts it. Exit codes: 0 ok, 1 failed, 2 input error.
 */
export async function hookCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  if (sub === "pre-tool-use") return preToolUse(rest);
  if (sub === "install") return install(rest);
  process.stderr.write(
    "usage: crw flow hook pre-tool-use [--state DIR] | crw flow hook install [--codex-home DIR]\n",
  );
  return 2;
}

function options(args: string[], spec: Record<string, { type: "string" | "boolean" }>) {
  try {
    return parseArgs({ args, options: spec, allowPositionals: false, strict: true }).values as Record<
      string,
      string | boolean | undefined
    >;
  } catch (e) {
    process.stderr.write(`crw flow hook: ${asError(e).message}\n`);
    return null;
  }
}

async function preToolUse(args: string[]): Promise<number> {
  const values = options(args, { state: { type: "string" } });
  if (!values) return 2;
  let stdin: string;
  try {
    stdin = readFileSync(0, "utf8");
  } catch (e) {
    process.stderr.write(`crw flow hook: cannot read stdin: ${asError(e).message}\n`);
    return 1;
  }
  const result = runPreToolUse(stdin, { state: stateDirFrom(values.state as string | undefined) });
  for (const line of result.stderr) process.stderr.write(`${line}\n`);
  if (result.stdout) process.stdout.write(result.stdout);
  return result.exitCode;
}

async function install(args: string[]): Promise<number> {
  const values = options(args, {
    "codex-home": { type: "string" },
    state: { type: "string" },
    codex: { type: "string" },
    cwd: { type: "string" },
    command: { type: "string" },
    json: { type: "boolean" },
  });
  if (!values) return 2;
  const { codexHomeFrom, installHook, shellWord } = await import("./install.js");
  const { listHooks } = await import("./listHooks.js");
  const home = codexHomeFrom(values["codex-home"] as string | undefined);
  const state = values.state as string | undefined;
  const cli = process.argv[1] ? resolve(process.argv[1]) : "crw";
  const command =
    (values.command as string | undefined) ??
    [
      process.execPath,
      cli,
      "flow",
      "hook",
      "pre-tool-use",
      ...(state ? ["--state", isAbsolute(state) ? state : resolve(state)] : []),
    ]
      .map(shellWord)
      .join(" ");
  const cwd = (values.cwd as string | undefined) ?? process.cwd();
  try {
    const outcome = await installHook({
      codexHome: home,
      command,
      listHooks: (codexHome) => listHooks({ codexHome, cwd, codex: values.codex as string | undefined }),
    });
    if (values.json) process.stdout.write(`${JSON.stringify(outcome)}\n`);
    else
      process.stdout.write(
        `spawn hook ${outcome.added ? "installed" : "already installed"} in ${outcome.config}; ${outcome.trusted ? "trusted" : "already trusted"} (${outcome.key} ${outcome.hash})${outcome.restartNeeded ? "; restart the app-server to apply it" : ""}\n`,
      );
    return 0;
  } catch (e) {
    const err = asError(e);
    if (values.json)
      process.stdout.write(
        `${JSON.stringify({ error: { code: (err as { code?: string }).code ?? "failed", message: err.message } })}\n`,
      );
    process.stderr.write(`crw flow hook install: ${err.message}\n`);
    return 1;
  }
}
