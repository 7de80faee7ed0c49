import { randomUUID } from "node:crypto";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type JournalEntry, PgDelegationRepository, type TranscriptMessage } from "@crw/db";
import type pg from "pg";
import {
  createScriptedTurnRunner,
  DelegationService,
  type DelegationServiceOptions,
  FileSpillStore,
  type MutatingTool,
  type Script,
  scriptTask,
} from "../../src/index.js";

export { scriptTask };

export function makeService(pool: pg.Pool, overrides: Partial<DelegationServiceOptions> = {}) {
  const repo = new PgDelegationRepository(pool);
  const spillRoot = mkdtempSync(join(tmpdir(), "crw-spill-"));
  const service = new DelegationService({
    repo,
    runner: createScriptedTurnRunner(),
    spill: new FileSpillStore(spillRoot),
    helperWaitMs: 200,
    ...overrides,
  });
  return { repo, service, spillRoot };
}

export async function newParent(
  service: DelegationService,
  account: Partial<Parameters<PgDelegationRepository["createAccount"]>[0]> = {},
) {
  const acct = await service.repo.createAccount({ name: `acct-${randomUUID()}`, ...account });
  const parent = await service.createRootSession(acct.id, "scripted");
  return { account: acct, parent };
}

export const delegateCall = (child: Script, extra: Record<string, unknown> = {}) => ({
  name: "Delegate",
  arguments: { task: scriptTask(child), ...extra },
});

/** Polls `check` until it holds; every wait in a test has this bound. */
export async function waitFor<T>(
  check: () => Promise<T | undefined | false>,
  what: string,
  boundMs = 20_000,
): Promise<T> {
  const deadline = Date.now() + boundMs;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export function messages(entries: readonly JournalEntry[]): TranscriptMessage[] {
  return entries.flatMap((e) => (e.body.type === "message" ? [e.body.message] : []));
}

export function resultIdsIn(entries: readonly JournalEntry[]): string[] {
  return messages(entries).flatMap((m) =>
    (m.role === "custom" || m.role === "toolResult") && m.details?.resultId ? [m.details.resultId] : [],
  );
}

/** A tool that waits for a gate the test opens (bounded). */
export function gateTool(name: string, gates: Map<string, Promise<void>>, mutates = false): MutatingTool {
  return {
    name,
    description: "waits for the test",
    parameters: {},
    mutates,
    async execute(args) {
      const key = String(args.key ?? "default");
      const gate = gates.get(key);
      if (gate) await Promise.race([gate, new Promise((r) => setTimeout(r, 15_000))]);
      return { content: `gate ${key} open` };
    },
  };
}

export function latch() {
  let open!: () => void;
  const promise = new Promise<void>((r) => {
    open = r;
  });
  return { promise, open };
}
