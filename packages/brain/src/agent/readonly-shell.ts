/**
 * The read-only shell clamp: a command line runs in a read-only turn only when it parses as a pipeline of
 * known non-mutating commands. Anything the parser does not understand (redirection, substitution, command
 * lists, background jobs, unknown programs, flags that write files or run other programs) is refused, so
 * the clamp errs towards refusal.
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
const READ_ONLY_GIT = new Set(["status", "log", "diff", "show", "rev-parse", "ls-files", "blame"]);

/** Per program: flags that write a file or start another program. */
const UNSAFE_FLAGS: Readonly<Record<string, RegExp>> = {
  find: /^-(delete|exec|execdir|ok|okdir|fprint|fprint0|fprintf|fls)$/,
  sort: /^(-o|--output|--compress-program)/,
  rg: /^(--pre|--pre-glob)/,
  tree: /^(-o|-R)/,
  file: /^(-C|--compile)/,
  git: /^(--output|--ext-diff|--textconv|-O|--open-files-in-pager|--exec|-c$|--config|-C$|--git-dir|--work-tree)/,
};

export function isReadOnlyCommand(command: string): boolean {
  if (command.trim() === "" || /[;&<>`$\n\r\\]/.test(command)) return false;
  for (const segment of command.split("|")) {
    const words = segment.trim().split(/\s+/).filter(Boolean);
    const [program, ...args] = words;
    if (!program || !READ_ONLY_PROGRAMS.has(program)) return false;
    const unsafe = UNSAFE_FLAGS[program];
    if (unsafe && args.some((a) => unsafe.test(a))) return false;
    // Git's global options (before the subcommand) can change which programs it runs: none are accepted.
    if (program === "git" && !READ_ONLY_GIT.has(args[0] ?? "")) return false;
  }
  return true;
}
