import { groups } from "./groups.js";
import { version } from "./version.js";

export const EXIT_OK = 0;
export const EXIT_INPUT = 2;

export function helpText(): string {
  const width = Math.max(...groups.map((g) => g.name.length));
  return [
    "crw: a durable runtime for delegating work to AI agents",
    "",
    "Usage: crw <group> <command> [options]",
    "",
    "Command groups:",
    ...groups.map(
      (g) => `  ${g.name.padEnd(width)}  ${g.summary}${g.run ? "" : " (not available in this build)"}`,
    ),
    "",
    "Options:",
    "  -h, --help     show this help (crw <group> --help for a group's commands)",
    "  -v, --version  print the version",
  ].join("\n");
}

/** Runs one command line and answers its exit code: 0 ok, 1 refused or failed, 2 input error. */
export async function runCli(argv: string[]): Promise<number> {
  const [first, ...rest] = argv;
  if (first === undefined || first === "-h" || first === "--help" || first === "help") {
    process.stdout.write(`${helpText()}\n`);
    return first === undefined ? EXIT_INPUT : EXIT_OK;
  }
  if (first === "-v" || first === "--version") {
    process.stdout.write(`crw ${version()}\n`);
    return EXIT_OK;
  }
  const group = groups.find((g) => g.name === first);
  if (!group) {
    process.stderr.write(`crw: unknown command group '${first}'; run 'crw --help' for the list\n`);
    return EXIT_INPUT;
  }
  if (!group.run) {
    process.stderr.write(
      `crw: '${first}' is not available in this build yet; run 'crw --help' for what is\n`,
    );
    return EXIT_INPUT;
  }
  return group.run(rest);
}
