import type { DelegationServiceOptions } from "@crw/brain";
import type { DelegationRepository } from "@crw/db";

/** The daemon's project registry, from PostgreSQL: what delegation placement asks of the host. */
export function projectRegistry(
  repo: DelegationRepository,
): NonNullable<DelegationServiceOptions["projects"]> {
  return {
    rootOf: async (ref) => {
      const p = await repo.getProject(ref);
      return p ? { ref: p.ref, root: p.root } : undefined;
    },
    projectForPath: async (dir) => {
      const p = await repo.projectForPath(dir);
      return p ? { ref: p.ref, root: p.root } : undefined;
    },
    grantedTo: async (accountId, ref) => (await repo.getProject(ref))?.accounts.includes(accountId) ?? false,
  };
}
