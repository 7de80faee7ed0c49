import { randomUUID } from "node:crypto";
import { captureDelegatedExecutionScope } from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import { boundaryAgainst, currentDelegatedAccess } from "../src/index.js";
import { closeEnginesAfterEach, oneNodeDefinition, until, untilAborted, world } from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

/** Stores a delegated child of `parent` for `accountId`, its scope the host target plus `scope`. */
function delegator(repo: PgDelegationRepository, accountId: string) {
  return async (parent: string, scope: Record<string, unknown>) =>
    (
      await repo.createDelegation({
        parentSessionId: parent,
        principalAccountId: accountId,
        toolCallId: `c-${randomUUID()}`,
        task: "t",
        mode: "background",
        model: "scripted",
        scope: captureDelegatedExecutionScope({
          accountId,
          target: { kind: "host", ref: null },
          ...scope,
        }),
      })
    ).child;
}

async function setup(account: { isOwner?: boolean; toolAllow?: string[] | null } = {}) {
  const repo = new PgDelegationRepository(db.pool);
  const acct = await repo.createAccount({
    name: `a-${randomUUID()}`,
    isOwner: account.isOwner ?? true,
    toolAllow: account.toolAllow ?? null,
  });
  const root = await repo.createRootSession(acct.id, "scripted");
  return { repo, acct, root, delegate: delegator(repo, acct.id) };
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

  it("an owner's delegated child read back from storage still carries owner authority (S004-319)", async () => {
    const { acct, root, delegate } = await setup({ isOwner: true });
    const child = await delegate(root.id, { operator: true });
    // A repository of its own: only what is stored speaks, as after a restart.
    const now = await currentDelegatedAccess(new PgDelegationRepository(db.pool), acct.id, child.id);
    if (!now.ok) throw new Error(now.reason);
    expect(now.authority.operator).toBe(true);
    const operatorScope = captureDelegatedExecutionScope({
      accountId: acct.id,
      operator: true,
      target: { kind: "host", ref: null },
    });
    expect(await boundaryAgainst(now.authority)({ subject: "parent", scope: operatorScope })).toEqual({
      ok: true,
    });
  });

  it("that authority holds only while the account proves it: owner flag, project access, tool allow and deny lists, permission settings (S004-320)", async () => {
    const { repo, acct, root, delegate } = await setup({ isOwner: true });
    const child = await delegate(root.id, {
      operator: true,
      tools: { allow: ["Read", "Bash"] },
      permissionBoundary: "workspace-write",
    });
    const access = () => currentDelegatedAccess(repo, acct.id, child.id);
    // Each change of the account alone refuses the origin; undone, the origin passes again.
    const refusedFor = async (change: string, reason: string) => {
      await db.pool.query(`update accounts set ${change} where id = $1::uuid`, [acct.id]);
      expect(await access()).toMatchObject({ ok: false, reason: expect.stringContaining(reason) });
      await db.pool.query(
        "update accounts set is_owner = true, tool_allow = null, tool_deny = '{}', permission_settings = '{}' where id = $1::uuid",
        [acct.id],
      );
      expect(await access()).toMatchObject({ ok: true });
    };
    expect(await access()).toMatchObject({ ok: true });
    await refusedFor("is_owner = false", "operator authority is no longer held");
    await refusedFor("tool_allow = array['Read']", "allow-list entry is not fully covered");
    await refusedFor("tool_deny = array['Bash']", "current access denies Bash");
    await refusedFor(
      `permission_settings = '{"permissionBoundary":"read-only"}'`,
      "permission boundary is wider than current access",
    );
    // Project access: an ordinary account's origin working in a host project passes while the project is
    // granted to the account, and is refused once the grant or the project is gone. (Ancestors and the
    // account's existence: the tests of S004-315 and S004-321.)
    const plain = await setup({ isOwner: false });
    const ref = `p-${randomUUID().slice(0, 8)}`;
    await plain.repo.addProject(ref, `/srv/${ref}`);
    await plain.repo.grantProject(ref, plain.acct.id);
    const inProject = await plain.delegate(plain.root.id, { target: { kind: "host", ref } });
    const projectAccess = () => currentDelegatedAccess(plain.repo, plain.acct.id, inProject.id);
    expect(await projectAccess()).toMatchObject({ ok: true });
    await db.pool.query("delete from project_grants where project_ref = $1", [ref]);
    expect(await projectAccess()).toMatchObject({
      ok: false,
      reason: expect.stringContaining("no longer granted"),
    });
    // an owner needs no grant, but the project must still exist
    const owned = await delegate(root.id, { target: { kind: "host", ref } });
    expect(await currentDelegatedAccess(repo, acct.id, owned.id)).toMatchObject({ ok: true });
    await db.pool.query("delete from projects where ref = $1", [ref]);
    expect(await currentDelegatedAccess(repo, acct.id, owned.id)).toMatchObject({
      ok: false,
      reason: expect.stringContaining("no longer exists"),
    });
  });

  it("boot recovery judges a workflow started under a delegated conversation by that conversation's stored chain: an ancestor the account no longer grants refuses it (S004-312)", async () => {
    const w = await world(db.pool);
    const delegate = delegator(w.repo, w.accountId);
    const mid = await delegate(w.parentSessionId, { tools: { allow: ["Read", "Bash(git *)"] } });
    const origin = await delegate(mid.id, { tools: { allow: ["Read"] } });
    const first = await w.engine(({ signal }) => untilAborted(signal));
    all.push(first.engine);
    const started = await first.engine.start(
      w.ctx({ parentSessionId: origin.id, access: { operator: false, tools: { allow: ["Read"] } } }),
      { definition: oneNodeDefinition },
    );
    await until(() => first.engine.run(started.workflowId)?.started.has("a") === true, "a running");
    await first.engine.close();
    // The origin's own Read is still granted; what its parent conversation was given is not.
    await db.pool.query("update accounts set tool_allow = array['Read'] where id = $1::uuid", [w.accountId]);
    let ran = 0;
    const second = await w.engine(() => {
      ran++;
      return "never";
    });
    all.push(second.engine);
    const recovered = await second.engine.recoverInterrupted();
    expect(recovered.refused).toContain(started.workflowId);
    const outcome = await second.engine.finished(started.workflowId);
    expect(outcome.status).toBe("failed");
    expect(outcome.summary).toContain(`session ${mid.id} exceeds current access`);
    expect(ran).toBe(0);
  });

  it("boot recovery rebuilds the origin's identity, permission policy and tool grants from the account as it is now: each narrowed while the daemon was down refuses the workflow, none narrowed resumes it (S004-314)", async () => {
    const w = await world(db.pool);
    const access = {
      operator: true,
      tools: { allow: ["Read", "Bash"] },
      permissionBoundary: "workspace-write" as const,
    };
    const narrowings = [
      { sql: "update accounts set is_owner = false where id = $1::uuid", reason: "operator" },
      {
        sql: `update accounts set permission_settings = '{"permissionBoundary":"read-only"}' where id = $1::uuid`,
        reason: "permissionBoundary",
      },
      { sql: "update accounts set tool_deny = '{Bash}' where id = $1::uuid", reason: "denies Bash" },
      { sql: null, reason: null },
    ];
    for (const narrowing of narrowings) {
      const first = await w.engine(({ signal }) => untilAborted(signal));
      all.push(first.engine);
      const started = await first.engine.start(w.ctx({ access }), { definition: oneNodeDefinition });
      await until(() => first.engine.run(started.workflowId)?.started.has("a") === true, "a running");
      await first.engine.close();
      if (narrowing.sql) await db.pool.query(narrowing.sql, [w.accountId]);
      let ran = 0;
      const second = await w.engine(() => {
        ran++;
        return "done again";
      });
      all.push(second.engine);
      const recovered = await second.engine.recoverInterrupted();
      const outcome = await second.engine.finished(started.workflowId);
      if (narrowing.reason === null) {
        expect(recovered.refused).not.toContain(started.workflowId);
        expect(outcome.status).toBe("completed");
        expect(ran).toBe(1);
      } else {
        expect(recovered.refused, narrowing.reason).toContain(started.workflowId);
        expect(outcome.status).toBe("failed");
        expect(outcome.summary).toContain(narrowing.reason);
        expect(ran).toBe(0);
      }
      await second.engine.close();
      await db.pool.query(
        "update accounts set is_owner = true, permission_settings = '{}', tool_deny = '{}' where id = $1::uuid",
        [w.accountId],
      );
    }
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
