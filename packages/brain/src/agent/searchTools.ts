import { z } from "zod";

/**
 * The search tools people expect beside read: ls, find and grep. Each is one fixed command line whose
 * arguments are single-quoted (never spliced into shell syntax), run in the read-only sandbox like any
 * shell command, bounded in results; the model gets their output with nothing to quote or escape.
 */
export const SEARCH_TOOL_NAMES = ["ls", "find", "grep"] as const;
export type SearchToolName = (typeof SEARCH_TOOL_NAMES)[number];

const MAX_LISTED = 1000;
const MAX_MATCHES = 200;
/** Every argument lands on the command line, where a U+0000 makes spawn throw a TypeError: refused here. */
const argument = (max: number) =>
  z
    .string()
    .min(1)
    .max(max)
    .refine((s) => !s.includes("\u0000"), "may not contain U+0000");
const path = argument(4096).default(".");

const ARGS = {
  ls: z.strictObject({ path }),
  find: z.strictObject({ pattern: argument(256), path }),
  grep: z.strictObject({
    pattern: argument(1000),
    path,
    literal: z.boolean().optional(),
    ignoreCase: z.boolean().optional(),
    glob: argument(256).optional(),
  }),
} as const;

const pathProperty = {
  type: "string",
  description: "Directory, relative to the working directory (default .)",
};

export const SEARCH_TOOLS: Record<SearchToolName, { description: string; parameters: object }> = {
  ls: {
    description: "List a directory of the working directory (directories end in /).",
    parameters: { type: "object", properties: { path: pathProperty }, additionalProperties: false },
  },
  find: {
    description: "Find files and directories whose name matches a glob (e.g. *.ts), below a directory.",
    parameters: {
      type: "object",
      properties: { pattern: { type: "string", description: "A name glob" }, path: pathProperty },
      required: ["pattern"],
      additionalProperties: false,
    },
  },
  grep: {
    description: "Search file contents for a regular expression (or literal text); prints file:line: text.",
    parameters: {
      type: "object",
      properties: {
        pattern: {
          type: "string",
          description: "An extended regular expression, or literal text with literal",
        },
        path: pathProperty,
        literal: { type: "boolean", description: "Match the pattern as plain text" },
        ignoreCase: { type: "boolean" },
        glob: { type: "string", description: "Only files whose name matches this glob (e.g. *.ts)" },
      },
      required: ["pattern"],
      additionalProperties: false,
    },
  },
};

export function parseSearchArgs(
  name: SearchToolName,
  params: unknown,
): { path: string } & Record<string, unknown> {
  return ARGS[name].parse(params);
}

const quote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

/** The command line of a search call; `where` is its directory, already checked to be inside the work dir. */
export function searchCommand(name: SearchToolName, args: Record<string, unknown>, where: string): string {
  const dir = quote(where);
  switch (name) {
    case "ls":
      return `ls -1Ap -- ${dir} | head -n ${MAX_LISTED}`;
    case "find":
      return `find ${dir} -name .git -prune -o -name ${quote(String(args.pattern))} -print | head -n ${MAX_LISTED}`;
    case "grep": {
      const flags = [
        "-rnI",
        "--exclude-dir=.git",
        args.literal ? "-F" : "-E",
        ...(args.ignoreCase ? ["-i"] : []),
      ];
      if (typeof args.glob === "string") flags.push(`--include=${quote(args.glob)}`);
      // With no directory operand grep -r searches `.` and names files without a leading ./
      const operand = where === "." ? "" : ` -- ${dir}`;
      return `grep ${flags.join(" ")} -e ${quote(String(args.pattern))}${operand} | head -n ${MAX_MATCHES}`;
    }
  }
}
