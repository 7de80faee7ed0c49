import { mkdirSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { removeIfExists, writeFileAtomic } from "../util/fsx.js";

/**
 * The file step bus (engine.FileStepBus) under `<state>/flow/<run>/steps/<call>/`:
 *   packet-t<k>-a<n>.md      the packet of a turn's step
 *   t<k>-a<n>.json           the step: what the owner is to do (spawn or send_input)
 *   close-a<n>-<agent>.json  a subagent to close (one file per subagent)
 * The run's process writes them after the step_published row is durable, and retracts a step once it is
 * bound. `crw flow next` reads them and removes a close file once it has handed it out.
 */
export interface StepFile {
  run_id: string;
  call: string;
  k: number;
  attempt: number;
  op: string;
  marker: string;
  role: string;
  action: "spawn" | "send_input";
  agent_type: string;
  model: string | null;
  reasoning_effort: string | null;
  message: string;
  packet: string;
  workspace: string;
  agent_id: string | null;
}

export interface CloseFile {
  run_id: string;
  call: string;
  attempt: number;
  action: "close";
  agent_id: string;
}

export function stepDir(stepsDir: string, call: string): string {
  return join(stepsDir, call);
}

export function packetPath(stepsDir: string, call: string, k: number, attempt: number): string {
  return join(stepsDir, call, `packet-t${k}-a${attempt}.md`);
}

export function stepPath(stepsDir: string, call: string, k: number, attempt: number): string {
  return join(stepsDir, call, `t${k}-a${attempt}.json`);
}

export function closePath(stepsDir: string, call: string, attempt: number, agent: string): string {
  return join(stepsDir, call, `close-a${attempt}-${safeName(agent)}.json`);
}

export function safeName(s: string): string {
  return s.replace(/[^A-Za-z0-9._-]/g, "_").slice(0, 120);
}

/** Optional seam for tests: a write that fails the way a full disk does. */
export type StepWriteHook = (path: string) => void;

export class FileStepBus {
  constructor(
    readonly stepsDir: string,
    private readonly beforeWrite: StepWriteHook | null = null,
  ) {}

  /**
   * Writes the packet, then the step (each whole, by rename). Throws when either cannot be written.
   * The bus's files are small and never fsync'd (the row that announces them is durable first), so they are
   * written on the event loop: an asynchronous write and rename is four thread-pool round trips, which cost
   * the run process more CPU than the write itself.
   */
  writeStep(step: StepFile, packetText: string): void {
    this.callDir(step.call);
    this.beforeWrite?.(step.packet);
    writeFileAtomic(step.packet, packetText);
    const path = stepPath(this.stepsDir, step.call, step.k, step.attempt);
    this.beforeWrite?.(path);
    writeFileAtomic(path, `${JSON.stringify(step, null, 2)}\n`);
  }

  retractStep(call: string, k: number, attempt: number): void {
    removeIfExists(stepPath(this.stepsDir, call, k, attempt));
  }

  writeClose(close: CloseFile): void {
    this.callDir(close.call);
    writeFileAtomic(
      closePath(this.stepsDir, close.call, close.attempt, close.agent_id),
      `${JSON.stringify(close)}\n`,
    );
  }

  /** Each call's directory is made once per process (a mkdir costs a metadata write even when it exists). */
  private readonly made = new Set<string>();
  private callDir(call: string): void {
    if (this.made.has(call)) return;
    mkdirSync(stepDir(this.stepsDir, call), { recursive: true });
    this.made.add(call);
  }
}

export interface ListedSteps {
  steps: StepFile[];
  closes: Array<CloseFile & { path: string }>;
  /** Files that could not be read as a step (malformed or hostile): reported, never handed out. */
  bad: string[];
}

/** Reads every step and close file of a run (light, no zod: the owner's per-step path). */
export function listStepFiles(stepsDir: string): ListedSteps {
  const out: ListedSteps = { steps: [], closes: [], bad: [] };
  let calls: string[];
  try {
    calls = readdirSync(stepsDir);
  } catch {
    return out;
  }
  for (const call of calls.sort()) listCallStepFiles(stepsDir, call, out);
  return out;
}

/** Adds one call's step and close files to `out` (an owner that knows which call's directory changed). */
export function listCallStepFiles(
  stepsDir: string,
  call: string,
  out: ListedSteps = { steps: [], closes: [], bad: [] },
): ListedSteps {
  let names: string[];
  try {
    names = readdirSync(join(stepsDir, call));
  } catch {
    return out;
  }
  for (const name of names.sort()) {
    const path = join(stepsDir, call, name);
    if (/^t\d+-a\d+\.json$/.test(name)) {
      const v = readJson(path);
      if (isStepFile(v)) out.steps.push(v);
      else out.bad.push(path);
    } else if (/^close-a\d+-.+\.json$/.test(name)) {
      const v = readJson(path);
      if (isCloseFile(v)) out.closes.push({ ...v, path });
      else out.bad.push(path);
    }
  }
  return out;
}

function readJson(path: string): unknown {
  try {
    const text = readFileSync(path, "utf8");
    if (text.length > 1_000_000) return undefined;
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function isStepFile(v: unknown): v is StepFile {
  if (!v || typeof v !== "object") return false;
  const o = v as Record<string, unknown>;
  return (
    typeof o.run_id === "string" &&
    typeof o.call === "string" &&
    Number.isInteger(o.k) &&
    Number.isInteger(o.attempt) &&
    typeof o.op === "string" &&
    typeof o.marker === "string" &&
    typeof o.role === "string" &&
    (o.action === "spawn" || o.action === "send_input") &&
    typeof o.agent_type === "string" &&
    typeof o.message === "string" &&
    typeof o.packet === "string" &&
    typeof o.workspace === "string" &&
    (o.agent_id === null || typeof o.agent_id === "string") &&
    (o.model === null || typeof o.model === "string") &&
    (o.reasoning_effort === null || typeof o.reasoning_effort === "string")
  );
}

function isCloseFile(v: unknown): v is CloseFile {
  if (!v || typeof v !== "object") return false;
  const o = v as Record<string, unknown>;
  return (
    typeof o.run_id === "string" &&
    typeof o.call === "string" &&
    Number.isInteger(o.attempt) &&
    o.action === "close" &&
    typeof o.agent_id === "string"
  );
}
