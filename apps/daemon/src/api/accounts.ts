import { parseToolEntry } from "@crw/brain";
import { type Account, type ApiTokenView, DelegationDbError } from "@crw/db";
import { z } from "zod";
import { newApiToken, tokenHash } from "../ownerToken.js";
import type { RpcContext, RpcRegistry } from "../rpc.js";
import type { DaemonRuntime } from "../runtime.js";

const refused = (code: string, message: string) =>
  Object.assign(new Error(message), { name: "AccountRequestError", code });

const toolEntry = z
  .string()
  .min(1)
  .max(650)
  .refine((e) => parseToolEntry(e) !== undefined, "not a tool entry (Name, Name*, or Name(argument glob))");
const toolList = z.array(toolEntry).max(500);
/** An account by name or id. */
const accountRef = z.string().min(1).max(200);
const accountName = z
  .string()
  .min(1)
  .max(200)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._@-]*$/, "letters, digits and . _ @ - (first a letter or digit)");

const accountView = (a: Account & { createdAt?: Date }) => ({
  id: a.id,
  name: a.name,
  owner: a.isOwner,
  administrator: a.isAdministrator,
  allow: a.toolAllow,
  deny: a.toolDeny,
  ...(a.createdAt ? { createdAt: a.createdAt.toISOString() } : {}),
});

const tokenView = (t: ApiTokenView) => ({
  id: t.id,
  account: t.accountName,
  accountId: t.accountId,
  label: t.label,
  createdAt: t.createdAt.toISOString(),
  revokedAt: t.revokedAt?.toISOString() ?? null,
});

/**
 * Accounts and their API tokens. Only the owner and administrators call these; an administrator manages
 * ordinary accounts (and its own tokens), while the owner's and administrators' accounts are the owner's
 * to manage. A token is answered once, at issue; only its hash is kept.
 */
export function registerAccountMethods(rpc: RpcRegistry, rt: DaemonRuntime): void {
  const caller = async (ctx: RpcContext): Promise<Account> => {
    const account = await rt.repo.getAccount(ctx.accountId);
    if (!account.isOwner && !account.isAdministrator)
      throw refused("not_permitted", "only the owner and administrators manage accounts and tokens");
    return account;
  };
  const mayManage = (who: Account, target: Account, own = false) => {
    if (who.isOwner || (own && who.id === target.id)) return;
    if (target.isOwner || target.isAdministrator)
      throw refused(
        "not_permitted",
        `only the owner manages ${target.name}, an owner or administrator account`,
      );
  };
  const find = async (ref: string): Promise<Account> => {
    const byId = z.uuid().safeParse(ref).success ? await rt.repo.getAccount(ref).catch(() => null) : null;
    const account = byId ?? (await rt.repo.accountByName(ref));
    if (!account) throw refused("not_found", `no account ${ref}`);
    return account;
  };

  rpc.register("account.create", {
    params: z.strictObject({
      name: accountName,
      administrator: z.boolean().optional(),
      allow: toolList.nullable().optional(),
      deny: toolList.optional(),
    }),
    handler: async (p, ctx) => {
      const who = await caller(ctx);
      if (p.administrator && !who.isOwner)
        throw refused("not_permitted", "only the owner makes administrators");
      const made = await rt.repo
        .createAccount({
          name: p.name,
          isAdministrator: p.administrator ?? false,
          toolAllow: p.allow ?? null,
          toolDeny: p.deny ?? [],
        })
        .catch((e: unknown) => {
          if (e instanceof DelegationDbError && e.code === "conflict")
            throw refused("conflict", `an account named ${p.name} exists`);
          throw e;
        });
      return accountView(made);
    },
  });

  rpc.register("account.list", {
    params: z.strictObject({}),
    handler: async (_p, ctx) => {
      await caller(ctx);
      return { accounts: (await rt.repo.listAccounts()).map(accountView) };
    },
  });

  rpc.register("account.grant", {
    params: z
      .strictObject({
        account: accountRef,
        /** null: every tool the host offers. */
        allow: toolList.nullable().optional(),
        deny: toolList.optional(),
      })
      .refine((p) => p.allow !== undefined || p.deny !== undefined, "give allow, deny or both"),
    handler: async (p, ctx) => {
      const who = await caller(ctx);
      const target = await find(p.account);
      if (target.isOwner)
        throw refused("not_permitted", "the owner account has every tool; it takes no grants");
      mayManage(who, target);
      const updated = await rt.repo.setAccountGrants(target.id, {
        toolAllow: p.allow === undefined ? target.toolAllow : p.allow,
        toolDeny: p.deny ?? target.toolDeny,
      });
      return accountView(updated);
    },
  });

  rpc.register("token.issue", {
    params: z.strictObject({ account: accountRef, label: z.string().max(200).optional() }),
    handler: async (p, ctx) => {
      const who = await caller(ctx);
      const target = await find(p.account);
      mayManage(who, target, true);
      const token = newApiToken();
      await rt.repo.addApiToken(target.id, tokenHash(token), p.label ?? "");
      const id = tokenHash(token).subarray(0, 6).toString("hex");
      return { token, id, account: target.name, accountId: target.id, label: p.label ?? "" };
    },
  });

  rpc.register("token.list", {
    params: z.strictObject({ account: accountRef.optional() }),
    handler: async (p, ctx) => {
      const who = await caller(ctx);
      const target = p.account ? await find(p.account) : undefined;
      const tokens = await rt.repo.listApiTokens(target?.id);
      // an administrator sees the tokens of the accounts it manages, and its own
      const accounts = new Map((await rt.repo.listAccounts()).map((a) => [a.id, a]));
      const visible = tokens.filter((t) => {
        const a = accounts.get(t.accountId);
        return who.isOwner || t.accountId === who.id || (a && !a.isOwner && !a.isAdministrator);
      });
      return { tokens: visible.map(tokenView) };
    },
  });

  rpc.register("token.revoke", {
    params: z.strictObject({
      id: z.string().regex(/^[0-9a-f]{12}$/, "a token id is 12 hexadecimal characters"),
    }),
    handler: async (p, ctx) => {
      const who = await caller(ctx);
      const listed = (await rt.repo.listApiTokens()).find((t) => t.id === p.id);
      if (!listed) throw refused("not_found", `no token ${p.id}`);
      mayManage(who, await rt.repo.getAccount(listed.accountId), true);
      return tokenView(await rt.repo.revokeApiToken(p.id));
    },
  });
}
