import { parseArgs } from "node:util";
import { FlowError } from "../util/errors.js";

type OptionSpec = Record<string, { type: "string" | "boolean"; short?: string }>;

/** Parses a command's arguments; an unknown option or a missing positional is an input error (exit 2). */
export function parseCommand<T extends OptionSpec>(
  command: string,
  args: string[],
  options: T,
  positionals: string[],
  /** Positionals that may follow the required ones. */
  optional: string[] = [],
): {
  values: { [K in keyof T]?: T[K]["type"] extends "boolean" ? boolean : string } & { json?: boolean };
  positionals: string[];
} {
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs({
      args,
      options: { ...options, json: { type: "boolean" } },
      allowPositionals: true,
      strict: true,
    });
  } catch (e) {
    throw new FlowError("input", `crw flow ${command}: ${(e as Error).message}`, 2);
  }
  if (parsed.positionals.length < positionals.length) {
    throw new FlowError(
      "input",
      `crw flow ${command}: missing ${positionals.slice(parsed.positionals.length).join(", ")}; usage: crw flow ${command} ${positionals.join(" ")}`,
      2,
    );
  }
  if (parsed.positionals.length > positionals.length + optional.length) {
    throw new FlowError(
      "input",
      `crw flow ${command}: unexpected argument '${parsed.positionals[positionals.length + optional.length]}'`,
      2,
    );
  }
  return parsed as never;
}

export function intOption(name: string, value: string | undefined, fallback: number, min = 0): number {
  if (value === undefined) return fallback;
  if (!/^\d+$/.test(value) || Number(value) < min) {
    throw new FlowError("input", `--${name} must be an integer of at least ${min}, not '${value}'`, 2);
  }
  return Number(value);
}

export function numberOption(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0)
    throw new FlowError("input", `--${name} must be a number of seconds, not '${value}'`, 2);
  return n;
}

/** Prints a command's answer: JSON with --json, else the short human text. */
export function print(json: boolean | undefined, value: unknown, human: string): void {
  process.stdout.write(json ? `${JSON.stringify(value, null, 2)}\n` : `${human}\n`);
}
