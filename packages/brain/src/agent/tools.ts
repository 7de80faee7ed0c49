import { mkdir, open, readFile, realpath, stat } from "node:fs/promises";
import { dirname, isAbsolute, relative, resolve, sep } from "node:path";
import type { AgentTool, AgentToolResult } from "@mariozechner/pi-agent-core";
import type { TSchema } from "@mariozechner/pi-ai";
import { z } from "zod";
import type { DelegatedExecutionScope } from "../scope/index.js";
import { toolCallVerdict } from "../scope/index.js";
import { ToolCallRefusedError } from "./errors.js";
import {
  parseSearchArgs,
  SEARCH_TOOL_NAMES,
  SEARCH_TOOLS,
  type SearchToolName,
  searchCommand,
} from "./searchTools.js";
import { runShell } from "./shellRun.js";

/**
 * The child tool set: read, write, edit and shell, confined to the child's working directory and to its
 * durable scope. Scope patterns see a file tool's subject as its path relative to the working directory
 * (`write(src/*)`) and the shell's as its command line (`shell(git *)`). Shell commands run in the OS
 * sandbox of `sandbox.ts`, which is what confines them (read-only in a read-only turn): a command line is
 * never judged by its words.
 */
export const CHILD_TOOL_NAMES = ["read", "write", "edit", "shell", ...SEARCH_TOOL_NAMES] as const;
export type ChildToolName = (typeof CHILD_TOOL_NAMES)[number];
const WRITING_TOOLS = new Set<string>(["write", "edit"]);
/** A read loads the whole file before slicing lines: bound what that can cost. */
const MAX_READ_FILE_BYTES = 16 * 1024 * 1024;

export interface ChildToolOptions {
  readonly workDir: string;
  readonly scope: DelegatedExecutionScope;
  /** The per-call read-only clamp (a continuation from a plan-mode turn), on top of the scope's own flag. */
  readonly readOnly?: boolean;
  /** Every shell command is bounded; past this it is killed and reported. */
  readonly shellTimeoutMs?: number;
  /** Output beyond this many bytes is cut (the tail is kept for the shell, the head for read). */
  readonly maxOutputBytes?: number;
}

/**
 * A path or a command line: Node's fs and child_process throw a TypeError (ERR_INVALID_ARG_VALUE) on a
 * U+0000 in one, so it is refused with the other bad arguments, before the call is checked or run.
 */
const noNul = (schema: z.ZodString) => schema.refine((s) => !s.includes("\u0000"), "may not contain U+0000");
const pathArg = noNul(z.string().min(1));
const ReadArgs = z.strictObject({
  path: pathArg,
  offset: z.number().int().positive().optional(),
  limit: z.number().int().positive().optional(),
});
const WriteArgs = z.strictObject({ path: pathArg, content: z.string() });
const EditArgs = z.strictObject({ path: pathArg, oldText: z.string().min(1), newText: z.string() });
const ShellArgs = z.strictObject({
  command: noNul(z.string().min(1)),
  timeoutSeconds: z.number().positive().max(3600).optional(),
});

const SCHEMAS: Record<ChildToolName, object> = {
  read: {
    type: "object",
    properties: {
      path: { type: "string", description: "File path, relative to the working directory" },
      offset: { type: "integer", minimum: 1, description: "First line to return (1-based)" },
      limit: { type: "integer", minimum: 1, description: "Number of lines to return" },
    },
    required: ["path"],
    additionalProperties: false,
  },
  write: {
    type: "object",
    properties: { path: { type: "string" }, content: { type: "string" } },
    required: ["path", "content"],
    additionalProperties: false,
  },
  edit: {
    type: "object",
    properties: {
      path: { type: "string" },
      oldText: { type: "string", description: "Exact text to replace; must occur exactly once" },
      newText: { type: "string" },
    },
    required: ["path", "oldText", "newText"],
    additionalProperties: false,
  },
  shell: {
    type: "object",
    properties: { command: { type: "string" }, timeoutSeconds: { type: "number" } },
    required: ["command"],
    additionalProperties: false,
  },
  ls: SEARCH_TOOLS.ls.parameters,
  find: SEARCH_TOOLS.find.parameters,
  grep: SEARCH_TOOLS.grep.parameters,
};

const DESCRIPTIONS: Record<ChildToolName, string> = {
  read: "Read a text file in the working directory.",
  write: "Create or replace a file in the working directory (parent directories are created).",
  edit: "Replace one exact occurrence of oldText with newText in a file.",
  shell:
    "Run a shell command in the working directory and return its exit code and output. It runs in a " +
    "sandbox: only the working directory is writable (nothing is in a read-only turn), /tmp is private " +
    "and discarded, there is no network, and processes left running end with the command.",
  ls: SEARCH_TOOLS.ls.description,
  find: SEARCH_TOOLS.find.description,
  grep: SEARCH_TOOLS.grep.description,
};

/** Name and description of each tool the scope lets the model see, for the prompt's tool catalog. */
export function childToolSummaries(
  options: ChildToolOptions,
): { name: ChildToolName; description: string }[] {
  return permittedToolNames(options).map((name) => ({ name, description: DESCRIPTIONS[name] }));
}

export function effectiveReadOnly(options: ChildToolOptions): boolean {
  return (
    options.scope.readOnly || options.scope.permissionBoundary === "read-only" || options.readOnly === true
  );
}

/** The tools whose name the scope's lists can ever allow: the catalog the model is shown. */
export function permittedToolNames(options: ChildToolOptions): ChildToolName[] {
  return CHILD_TOOL_NAMES.filter((name) => {
    const lists = options.scope.tools;
    // A denial without an argument pattern removes the whole tool; one with a pattern removes only calls.
    if (lists.deny.some((d) => !d.includes("(") && toolCallVerdict({ deny: [d] }, name, "").ok === false))
      return false;
    if (lists.allow === undefined) return true;
    return lists.allow.some(
      (entry) => toolCallVerdict({ allow: [entry.replace(/\(.*\)$/s, "")], deny: [] }, name).ok,
    );
  }).filter((name) => !(WRITING_TOOLS.has(name) && effectiveReadOnly(options)));
}

function subjectPath(workDir: string, path: string): { absolute: string; subject: string } | undefined {
  const absolute = resolve(workDir, path);
  const rel = relative(workDir, absolute);
  if (rel === "") return { absolute, subject: "." };
  if (rel.startsWith("..") || isAbsolute(rel)) return undefined;
  return { absolute, subject: rel.split(sep).join("/") };
}

/** Git metadata is crw's: a hook, fsmonitor or filter written there would run on the host when crw commits. */
const inGitMetadata = (subject: string) => subject.split("/").includes(".git");

export interface CheckedCall {
  readonly name: ChildToolName;
  readonly subject: string;
  readonly absolutePath?: string;
}

/**
 * Decides whether a call may run, before it has any effect. Throws `ToolCallRefusedError` for a tool the
 * scope does not allow or denies, a write in a read-only turn, or a path outside the working directory.
 */
export function checkChildToolCall(
  options: ChildToolOptions,
  name: string,
  args: Record<string, unknown>,
): CheckedCall {
  if (!(CHILD_TOOL_NAMES as readonly string[]).includes(name)) {
    throw new ToolCallRefusedError("unknown_tool", `no tool named ${name}`, { toolName: name });
  }
  const tool = name as ChildToolName;
  let subject: string;
  let absolutePath: string | undefined;
  if (tool === "shell") subject = typeof args.command === "string" ? args.command : "";
  else {
    const placed = subjectPath(options.workDir, typeof args.path === "string" ? args.path : "");
    if (!placed) {
      throw new ToolCallRefusedError(
        "outside_work_dir",
        `${tool} refused: ${String(args.path)} is outside the working directory`,
        {
          toolName: tool,
          subject: String(args.path),
        },
      );
    }
    subject = placed.subject;
    absolutePath = placed.absolute;
  }
  const verdict = toolCallVerdict(options.scope.tools, tool, subject);
  if (!verdict.ok) {
    if (verdict.reason === "denied") {
      throw new ToolCallRefusedError("tool_denied", `${tool} refused: denied by ${verdict.entry}`, {
        toolName: tool,
        subject,
        entry: verdict.entry,
      });
    }
    throw new ToolCallRefusedError(
      "tool_not_allowed",
      `${tool} refused: not in this session's tool allow-list`,
      { toolName: tool, subject },
    );
  }
  // A read-only turn's shell is confined by its sandbox's read-only mounts, not refused here.
  if (WRITING_TOOLS.has(tool) && inGitMetadata(subject)) {
    throw new ToolCallRefusedError(
      "git_metadata",
      `${tool} refused: ${subject} is git metadata, which only crw writes`,
      {
        toolName: tool,
        subject,
      },
    );
  }
  if (effectiveReadOnly(options) && WRITING_TOOLS.has(tool)) {
    throw new ToolCallRefusedError("read_only", `${tool} refused: this turn is read-only`, {
      toolName: tool,
      subject,
    });
  }
  return { name: tool, subject, ...(absolutePath ? { absolutePath } : {}) };
}

/** Symlinks must not lead out of the working directory either: check the real path of what exists. */
/**
 * The working directory was admitted as a real path at the turn's start: if it resolves elsewhere now (a
 * directory swapped for a link by a session working beside this one), no call runs in it.
 */
async function inPlace(workDir: string, toolName: string): Promise<string> {
  const real = await realpath(workDir).catch(() => undefined);
  if (real !== resolve(workDir))
    throw new ToolCallRefusedError(
      "work_dir_moved",
      `${toolName} refused: the working directory moved or vanished`,
      {
        toolName,
        subject: workDir,
      },
    );
  return real;
}

async function confined(workDir: string, absolute: string, toolName: string): Promise<void> {
  const realRoot = await inPlace(workDir, toolName);
  let probe = absolute;
  for (;;) {
    const real = await realpath(probe).catch(() => undefined);
    if (real !== undefined) {
      const rel = relative(realRoot, real);
      if (rel.startsWith("..") || isAbsolute(rel)) {
        throw new ToolCallRefusedError(
          "outside_work_dir",
          `${toolName} refused: the path leads outside the working directory`,
          {
            toolName,
            subject: absolute,
          },
        );
      }
      return;
    }
    const parent = dirname(probe);
    if (parent === probe) return;
    probe = parent;
  }
}

function text(body: string, details: Record<string, unknown> = {}): AgentToolResult<Record<string, unknown>> {
  return { content: [{ type: "text", text: body }], details };
}

async function writeDurably(path: string, content: string): Promise<void> {
  await mkdir(dirname(path), { recursive: true });
  const handle = await open(path, "w");
  try {
    await handle.writeFile(content, "utf8");
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/**
 * Builds the tool objects for pi-agent-core. Each `execute` re-checks the call (the scope is the authority,
 * not the catalog) before touching anything; failures throw, which the loop turns into an error result.
 */
export function createChildTools(options: ChildToolOptions): AgentTool[] {
  const maxBytes = options.maxOutputBytes ?? 64 * 1024;
  // Searches read only: they run in the read-only sandbox whatever the turn may write.
  const search = async (name: SearchToolName, params: unknown, signal?: AbortSignal) => {
    const args = parseSearchArgs(name, params);
    const call = checkChildToolCall(options, name, args);
    await confined(options.workDir, call.absolutePath as string, name);
    const run = await runShell(searchCommand(name, args, call.subject), options.workDir, true, {
      timeoutMs: options.shellTimeoutMs ?? 120_000,
      maxBytes,
      signal,
    });
    if (run.exitCode !== 0) throw new Error(`${name} failed: ${run.timedOut ? "timed out" : run.output}`);
    return text(run.output.trim() === "" ? `(no ${name === "grep" ? "matches" : "entries"})` : run.output, {
      path: call.subject,
    });
  };
  const tools: Record<ChildToolName, AgentTool["execute"]> = {
    read: async (_id, params) => {
      const args = ReadArgs.parse(params);
      const call = checkChildToolCall(options, "read", args);
      await confined(options.workDir, call.absolutePath as string, "read");
      const size = (await stat(call.absolutePath as string)).size;
      if (size > MAX_READ_FILE_BYTES)
        throw new Error(
          `read refused: ${call.subject} has ${size} bytes, more than ${MAX_READ_FILE_BYTES}; use shell tools to look inside it`,
        );
      const body = await readFile(call.absolutePath as string, "utf8");
      let lines = body.split("\n");
      const start = (args.offset ?? 1) - 1;
      lines = lines.slice(start, args.limit === undefined ? undefined : start + args.limit);
      let out = lines.join("\n");
      if (Buffer.byteLength(out) > maxBytes)
        out = `${Buffer.from(out).subarray(0, maxBytes).toString("utf8")}\n[output cut at ${maxBytes} bytes]`;
      return text(out, { path: call.subject });
    },
    write: async (_id, params) => {
      const args = WriteArgs.parse(params);
      const call = checkChildToolCall(options, "write", args);
      await confined(options.workDir, call.absolutePath as string, "write");
      await writeDurably(call.absolutePath as string, args.content);
      return text(`wrote ${Buffer.byteLength(args.content)} bytes to ${call.subject}`, {
        path: call.subject,
      });
    },
    edit: async (_id, params) => {
      const args = EditArgs.parse(params);
      const call = checkChildToolCall(options, "edit", args);
      await confined(options.workDir, call.absolutePath as string, "edit");
      const before = await readFile(call.absolutePath as string, "utf8");
      const first = before.indexOf(args.oldText);
      if (first < 0) throw new Error(`edit failed: oldText not found in ${call.subject}`);
      if (before.indexOf(args.oldText, first + 1) >= 0)
        throw new Error(`edit failed: oldText occurs more than once in ${call.subject}`);
      await writeDurably(
        call.absolutePath as string,
        before.slice(0, first) + args.newText + before.slice(first + args.oldText.length),
      );
      return text(`edited ${call.subject}`, { path: call.subject });
    },
    shell: async (_id, params, signal) => {
      const args = ShellArgs.parse(params);
      const call = checkChildToolCall(options, "shell", args);
      await inPlace(options.workDir, "shell");
      const timeoutMs = Math.min(
        args.timeoutSeconds ? args.timeoutSeconds * 1000 : Number.POSITIVE_INFINITY,
        options.shellTimeoutMs ?? 120_000,
      );
      const run = await runShell(call.subject, options.workDir, effectiveReadOnly(options), {
        timeoutMs,
        maxBytes,
        signal,
      });
      const status = run.timedOut
        ? `timed out after ${timeoutMs} ms`
        : run.exitCode === null
          ? `killed by ${run.signal}`
          : `exit code ${run.exitCode}`;
      const body = `${status}\n${run.output}`;
      if (run.exitCode !== 0) throw new Error(body);
      return text(body, { exitCode: run.exitCode });
    },
    ls: (_id, params, signal) => search("ls", params, signal),
    find: (_id, params, signal) => search("find", params, signal),
    grep: (_id, params, signal) => search("grep", params, signal),
  };
  return permittedToolNames(options).map((name) => ({
    name,
    label: name,
    description: DESCRIPTIONS[name],
    parameters: SCHEMAS[name] as TSchema,
    executionMode: "sequential",
    execute: tools[name],
  }));
}
