import { EXIT_INPUT, EXIT_OK, type FlowError } from "../util/errors.js";

/**
 * `crw flow …`: the owner's whole interface. This module and the owner's per-step commands (next,
 * dispatched) load no heavy module (no zod, no host adapter): each command's module is imported only
 * when it runs.
 */
const commands: Record<
  string,
  { summary: string; load: () => Promise<(args: string[]) => Promise<number>> }
> = {
  start: { summary: "start a workflow run", load: async () => (await import("./start.js")).startCommand },
  next: {
    summary: "the run's state and the steps to take",
    load: async () => (await import("./next.js")).nextCommand,
  },
  dispatched: {
    summary: "report the subagent spawned for a step and read the run's reply",
    load: async () => (await import("./dispatched.js")).dispatchedCommand,
  },
  resume: {
    summary: "resume a run no process holds",
    load: async () => (await import("./resume.js")).resumeCommand,
  },
  cancel: {
    summary: "end a run: stop its calls (interrupting running turns) and end it cancelled",
    load: async () => (await import("./cancel.js")).cancelCommand,
  },
  show: {
    summary: "a readable timeline of a run",
    load: async () => (await import("./show.js")).showCommand,
  },
  land: {
    summary: "merge an ended run's branch into the branch it started from (fast-forward when it can)",
    load: async () => (await import("./land.js")).landCommand,
  },
  answer: {
    summary: "answer a decision the run waits for, then resume it (unless --no-resume)",
    load: async () => (await import("../shadow/answer.js")).answerCommand,
  },
  shadow: {
    summary: "replay a run from its journal without any host; report its backend and any divergence",
    load: async () => (await import("../shadow/cli.js")).shadowCommand,
  },
  hook: {
    summary: "the spawn hook: pre-tool-use (PreToolUse JSON in, decision out) or install",
    load: async () => (await import("../bound/cli.js")).hookCommand,
  },
  _run: { summary: "", load: async () => (await import("./runProcess.js")).runProcessCommand },
};

export function flowHelp(): string {
  return [
    "crw flow: run a workflow durably as session calls of an owner Codex session",
    "",
    "Usage:",
    "  crw flow start WORKFLOW [--input JSON|@file] [--backend session|local] [--owner THREAD] [--pool N] [--token-ceiling N] [--trace] [--evidence] [--state DIR] [--host SPEC]",
    "                 [--repo DIR] [--model scripted|openai-responses:ID|…] [--script FILE]   (local: the default without an owner thread)",
    "                 [--model-base-url URL] [--model-api-key-env VAR] [--config FILE]   (local: your own provider server)",
    "  crw flow next RUN [--wait S]",
    "  crw flow dispatched RUN CALL --agent ID --k K --attempt N [--wait S]",
    "  crw flow resume RUN [SCRIPT] [--detach]",
    "  crw flow cancel RUN [--reason TEXT] [--wait S]",
    "  crw flow show RUN",
    "  crw flow land RUN [--into BRANCH]",
    "  crw flow shadow RUN [--workflow FILE]",
    "  crw flow answer RUN DECISION ANSWER [--no-resume] [--wait S]",
    "",
    "Every command takes --json and --state DIR (default: $CRW_STATE, else ~/.local/state/crw).",
    "Exit codes: 0 ok, 1 refused or failed, 2 input error.",
  ].join("\n");
}

export async function runFlowCli(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    process.stdout.write(`${flowHelp()}\n`);
    return name === undefined ? EXIT_INPUT : EXIT_OK;
  }
  const command = commands[name];
  if (!command) {
    process.stderr.write(`crw flow: unknown command '${name}'; run 'crw flow --help' for the list\n`);
    return EXIT_INPUT;
  }
  try {
    return await (await command.load())(rest);
  } catch (e) {
    if (e instanceof Error && e.name === "FlowError") {
      const fe = e as FlowError;
      const json = rest.includes("--json");
      if (json)
        process.stdout.write(`${JSON.stringify({ error: { code: fe.code, message: fe.message } })}\n`);
      process.stderr.write(`crw flow ${name}: ${fe.message}\n`);
      return fe.exitCode;
    }
    process.stderr.write(`crw flow ${name}: ${(e as Error)?.stack ?? String(e)}\n`);
    return 1;
  }
}
