import { randomUUID } from "node:crypto";
import type pg from "pg";
import {
  PgDelegationRepository,
  type QueuedResult,
  type SubagentRun,
  type TranscriptMessage,
} from "../../src/index.js";

/** A delivered result as the delegation core writes it into a parent's journal. */
export const asMessage = (q: QueuedResult): TranscriptMessage => ({
  role: "custom",
  customType: "delegation_result",
  content: q.body,
  details: { resultId: q.id },
});

/**
 * An account with a root session and `children` background calls of it (`call-0`, `call-1`, …), open and
 * in that order: what most repository tests start from.
 */
export async function family(pool: pg.Pool, children = 0, prefix = "t") {
  const r = new PgDelegationRepository(pool);
  const account = await r.createAccount({ name: `${prefix}-${randomUUID().slice(0, 8)}` });
  const parent = await r.createRootSession(account.id, "scripted");
  const runs: SubagentRun[] = [];
  for (let i = 0; i < children; i++) {
    const { run } = await r.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: `call-${i}`,
      task: `task ${i}`,
      mode: "background",
      model: "scripted",
      scope: "{}",
    });
    runs.push(run);
  }
  return { r, account, parent, runs };
}

/** Settles a run at its generation with `body`; returns the result id. */
export async function settle(
  r: PgDelegationRepository,
  run: { id: string; generation: number },
  body = "done",
) {
  const resultId = randomUUID();
  await r.settleRun({
    runId: run.id,
    generation: run.generation,
    resultId,
    outcome: "ok",
    body,
    byteSize: Buffer.byteLength(body),
  });
  return resultId;
}

/** A parent with `n` settled background calls: `n` results in its inbox, in this order (bodies r0, r1, …). */
export async function inbox(pool: pg.Pool, n: number, prefix = "t") {
  const f = await family(pool, n, prefix);
  const ids: string[] = [];
  for (const [i, run] of f.runs.entries()) ids.push(await settle(f.r, run, `r${i}`));
  return { ...f, ids, runIds: f.runs.map((run) => run.id) };
}
