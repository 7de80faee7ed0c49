import { constants } from "node:fs";
import { access, realpath, stat } from "node:fs/promises";
import { basename } from "node:path";
import type { Project } from "@crw/db";
import { z } from "zod";
import type { RpcContext, RpcRegistry } from "../rpc.js";
import type { DaemonRuntime } from "../runtime.js";

const refused = (code: string, message: string) =>
  Object.assign(new Error(message), { name: "ProjectRequestError", code });

const view = (p: Project) => ({
  name: p.ref,
  root: p.root,
  accounts: p.accounts,
  createdAt: p.createdAt.toISOString(),
});

/**
 * Project methods: register a directory of this host under a name and grant it to accounts; list them.
 * Only the owner and administrators may call them (they are the ones who may use any directory).
 */
export function registerProjectMethods(rpc: RpcRegistry, rt: DaemonRuntime): void {
  const operator = async (ctx: RpcContext) => {
    const account = await rt.repo.getAccount(ctx.accountId);
    if (!account.isOwner && !account.isAdministrator)
      throw refused("not_permitted", "only the owner and administrators manage projects");
  };

  rpc.register("project.add", {
    params: z.strictObject({
      path: z.string().min(1).max(4096),
      name: z.string().min(1).max(64).optional(),
      /** An account name or id to grant the project to. */
      account: z.string().min(1).max(200).optional(),
    }),
    handler: async (p, ctx) => {
      await operator(ctx);
      let root: string;
      try {
        root = await realpath(p.path);
        if (!(await stat(root)).isDirectory()) throw new Error("not a directory");
        await access(root, constants.R_OK | constants.X_OK);
      } catch {
        throw refused("work_dir_unavailable", `${p.path} is not an existing readable directory`);
      }
      rt.service.assertNotHostPrivate(root);
      const project = await rt.repo.addProject(p.name ?? basename(root), root);
      if (p.account) {
        const byId = z.uuid().safeParse(p.account).success
          ? await rt.repo.getAccount(p.account).catch(() => null)
          : null;
        const account = byId ?? (await rt.repo.accountByName(p.account));
        if (!account) throw refused("not_found", `no account ${p.account}`);
        await rt.repo.grantProject(project.ref, account.id);
      }
      return view((await rt.repo.getProject(project.ref)) ?? project);
    },
  });

  rpc.register("project.list", {
    params: z.strictObject({}),
    handler: async (_p, ctx) => {
      await operator(ctx);
      return { projects: (await rt.repo.listProjects()).map(view) };
    },
  });
}
