/**
 * The read-only shell clamp: a command line runs in a read-only turn only when it parses as a pipeline of
 * known non-mutating commands. Anything the parser does not understand (redirection, substitution, command
 * lists, background jobs, unknown programs, mutating flags) is refused, so the clamp errs towards refusal.
 */
const READ_ONLY_PROGRAMS = new Set([
  "cat",
  "head",
  "tail",
  "wc",
  "grep",
  "rg",
  "ls",
  "pwd",
  "echo",
  "stat",
  "file",
  "du",
  "tree",
  "sort",
  "uniq",
  "cut",
  "diff",
  "basename",
  "dirname",
  "realpath",
  "true",
  "false",
  "test",
  "find",
  "git",
]);
const READ_ONLY_GIT = new Set(["status", "log", "diff", "show", "rev-parse", "ls-files", "blame", "grep"]);
const FIND_ACTIONS = /^-(delete|exec|execdir|ok|okdir|fprint|fprint0|fprintf|fls)$/;

export function isReadOnlyCommand(command: string): boolean {
  if (command.trim() === "" || /[;&<>`$\n\r\\]/.test(command)) return false;
  for (const segment of command.split("|")) {
    const words = segment.trim().split(/\s+/).filter(Boolean);
    const [program, ...args] = words;
    if (!program || !READ_ONLY_PROGRAMS.has(program)) return false;
    if (program === "git") {
      const sub = args.find((a) => !a.startsWith("-"));
      if (!sub || !READ_ONLY_GIT.has(sub) || args.some((a) => a.startsWith("--output"))) return false;
    }
    if (program === "find" && args.some((a) => FIND_ACTIONS.test(a))) return false;
    if (program === "sort" && args.some((a) => a === "-o" || a.startsWith("--output"))) return false;
  }
  return true;
}
