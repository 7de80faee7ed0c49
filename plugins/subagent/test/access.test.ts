import { randomUUID } from "node:crypto";
import { captureDelegatedExecutionScope } from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import { boundaryAgainst, currentDelegatedAccess } from "../src/index.js";

const db = useTestDatabase();

async function setup(account: { isOwner?: boolean; toolAllow?: string[] | null } = {}) {
  const repo = new PgDelegationRepository(db.pool);
  const acct = await repo.createAccount({
    name: `a-${randomUUID()}`,
    isOwner: account.isOwner ?? true,
    toolAllow: account.toolAllow ?? null,
  });
  const root = await repo.createRootSession(acct.id, "scripted");
  const delegate = async (parent: string, scope: Record<string, unknown>) =>
    (
      await repo.createDelegation({
        parentSessionId: parent,
        principalAccountId: acct.id,
        toolCallId: `c-${randomUUID()}`,
        task: "t",
        mode: "background",
        model: "scripted",
        scope: captureDelegatedExecutionScope({
          accountId: acct.id,
          target: { kind: "host", ref: null },
          ...scope,
        }),
      })
    ).child;
  return { repo, acct, root, delegate };
}

async function rowCounts(): Promise<unknown> {
  const { rows } = await db.pool.query(
    "select (select count(*) from sessions) s, (select count(*) from journal_entries) j, (select count(*) from subagent_runs) r",
  );
  return rows[0];
}

describe("journaledBoundaryCheck's current access", () => {
  it("journal replay is verbatim: an allow entry merely overlapping a held one fails (S004-316 S004-317)", async () => {
    const acct = randomUUID();
    const check = boundaryAgainst({ accountId: acct, tools: { allow: ["Bash(git *)", "Read"] } });
    const scope = (allow: string[]) =>
      captureDelegatedExecutionScope({
        accountId: acct,
        target: { kind: "host", ref: null },
        tools: { allow },
      });
    expect(await check({ subject: "n", scope: scope(["Bash(git status)"]) })).toEqual({ ok: true });
    expect(await check({ subject: "n", scope: scope(["Bash"]) })).toMatchObject({
      ok: false,
      reason: expect.stringContaining("tools"),
    });
    expect(await check({ subject: "n", scope: scope(["Bash(*)"]) })).toMatchObject({ ok: false });
    expect(await check({ subject: "n", scope: "{not json" })).toMatchObject({
      ok: false,
      reason: expect.stringContaining("malformed"),
    });
  });

  it("an owner's delegated child keeps owner authority only while the account still proves it (S004-319 S004-320)", async () => {
    const { repo, acct, root, delegate } = await setup({ isOwner: true });
    const child = await delegate(root.id, { operator: true });
    const now = await currentDelegatedAccess(repo, acct.id, child.id);
    expect(now.ok && now.authority.operator).toBe(true);
    const operatorScope = captureDelegatedExecutionScope({
      accountId: acct.id,
      operator: true,
      target: { kind: "host", ref: null },
    });
    if (!now.ok) throw new Error(now.reason);
    expect(await boundaryAgainst(now.authority)({ subject: "parent", scope: operatorScope })).toEqual({
      ok: true,
    });
    await db.pool.query("update accounts set is_owner = false where id = $1::uuid", [acct.id]);
    // The stored operator scope is no longer proven by the account: the origin is refused outright.
    const later = await currentDelegatedAccess(repo, acct.id, child.id);
    expect(later).toMatchObject({
      ok: false,
      reason: expect.stringContaining("operator authority is no longer held"),
    });
  });

  it("malformed scopes, ancestry cycles, missing accounts and another account's session refuse; a parent link across accounts cannot be stored (S004-321)", async () => {
    const { repo, acct, root, delegate } = await setup();
    const child = await delegate(root.id, {});
    await db.pool.query('update sessions set scope = \'{"version":1,"accountId":"x"}\' where id = $1::uuid', [
      child.id,
    ]);
    expect(await currentDelegatedAccess(repo, acct.id, child.id)).toMatchObject({
      ok: false,
      reason: expect.stringContaining("stored scope is invalid"),
    });
    const a = await delegate(root.id, {});
    const b = await delegate(a.id, {});
    await db.pool.query("update sessions set parent_session_id = $2::uuid where id = $1::uuid", [a.id, b.id]);
    const cyc = await currentDelegatedAccess(repo, acct.id, b.id);
    expect(cyc).toMatchObject({ ok: false });
    expect(!cyc.ok && cyc.reason).toContain("cycle");
    const other = await setup();
    expect(await currentDelegatedAccess(repo, other.acct.id, root.id)).toMatchObject({ ok: false });
    // a parent link into another account's conversation cannot even be stored, so no chain crosses accounts
    const linked = await delegate(root.id, {});
    await expect(
      db.pool.query("update sessions set parent_session_id = $2::uuid where id = $1::uuid", [
        linked.id,
        other.root.id,
      ]),
    ).rejects.toMatchObject({ code: "23503" });
    expect(await currentDelegatedAccess(repo, acct.id, linked.id)).toMatchObject({ ok: true });
    expect(await currentDelegatedAccess(repo, randomUUID(), root.id)).toMatchObject({ ok: false });
  });
});

/**
 * A delegated origin two levels down (its parent allowed Read and Bash(git *), itself Read) is resolved for
 * a boundary check, then resolved again once the account no longer grants Bash(git *).
 */
describe("a delegated origin's current access", () => {
  let access: Awaited<ReturnType<typeof currentDelegatedAccess>>;
  let narrowed: Awaited<ReturnType<typeof currentDelegatedAccess>>;
  let rowsBefore: unknown;
  let rowsAfter: unknown;
  let midId: string;
  let checks: { bash: unknown; reads: unknown };
  beforeAll(async () => {
    const { repo, acct, root, delegate } = await setup();
    const mid = await delegate(root.id, { tools: { allow: ["Read", "Bash(git *)"] } });
    midId = mid.id;
    const origin = await delegate(mid.id, { tools: { allow: ["Read"] } });
    rowsBefore = await rowCounts();
    access = await currentDelegatedAccess(repo, acct.id, origin.id);
    rowsAfter = await rowCounts();
    if (!access.ok) throw new Error(access.reason);
    const check = boundaryAgainst(access.authority);
    const scope = (allow: string[]) =>
      captureDelegatedExecutionScope({
        accountId: acct.id,
        target: { kind: "host", ref: null },
        tools: { allow },
      });
    checks = {
      bash: await check({ subject: "n", scope: scope(["Bash"]) }),
      reads: await check({ subject: "n", scope: scope(["Read"]) }),
    };
    await db.pool.query("update accounts set tool_allow = array['Read'] where id = $1::uuid", [acct.id]);
    narrowed = await currentDelegatedAccess(repo, acct.id, origin.id);
  });

  it("a journaled scope is judged against the origin's current access: more than it holds fails, within it passes (S004-312)", () => {
    expect(checks.bash).toMatchObject({ ok: false });
    expect(checks.reads).toEqual({ ok: true });
  });

  it("the origin's access is its persisted scope, read as a resumed child's is (S004-313)", () => {
    expect(access.ok && access.authority.tools).toEqual({ allow: ["Read"], deny: [] });
  });

  it("every ancestor is checked against the account: one that no longer fits refuses the whole origin (S004-315)", () => {
    expect(narrowed).toMatchObject({ ok: false });
    expect(!narrowed.ok && narrowed.reason).toContain(`session ${midId} exceeds current access`);
  });

  it("resolving it writes nothing (S004-324)", () => {
    expect(rowsAfter).toEqual(rowsBefore);
  });
});
