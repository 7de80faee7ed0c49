import type { DaemonRuntime } from "../runtime.js";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

type Owns = (id: string) => Promise<boolean>;

/**
 * The /health document as one account may see it: the owner's is whole; anyone else's keeps only the
 * session, run and workflow ids that account owns. Ids are recognised by shape, not by field name, so a
 * field added to the document later is scoped too.
 */
export async function healthFor(rt: DaemonRuntime, accountId: string, doc: object): Promise<object> {
  const account = await rt.repo.getAccount(accountId);
  if (account.isOwner) return doc;
  return scopeHealthDocument(doc, ownedBy(rt, accountId));
}

/** Whether the id names a session, delegation run or workflow of the account; answered once per id. */
function ownedBy(rt: DaemonRuntime, accountId: string): Owns {
  const seen = new Map<string, Promise<boolean>>();
  const probe = async (id: string) => {
    const yes = () => true;
    const no = () => false;
    if (await rt.repo.getSession(id, accountId).then(yes, no)) return true;
    if (await rt.repo.getRun(id, accountId).then(yes, no)) return true;
    return (await rt.engine.store.getWorkflow(id, accountId).catch(() => null)) != null;
  };
  return (id) => {
    let known = seen.get(id);
    if (!known) {
      known = probe(id);
      seen.set(id, known);
    }
    return known;
  };
}

/**
 * Drops what is not the account's: an id it does not own (from a list; as a field it becomes null) and a
 * listed entry that names one (an execution of another account's session says that session exists).
 */
export async function scopeHealthDocument(doc: object, owns: Owns): Promise<object> {
  return (await scope(doc, owns)) as object;
}

const foreign = async (value: unknown, owns: Owns) =>
  typeof value === "string" && UUID.test(value) && !(await owns(value));

async function scope(value: unknown, owns: Owns): Promise<unknown> {
  if (Array.isArray(value)) {
    const kept: unknown[] = [];
    for (const item of value) {
      if (await foreign(item, owns)) continue;
      if (await namesForeign(item, owns)) continue;
      kept.push(await scope(item, owns));
    }
    return kept;
  }
  if (typeof value !== "object" || value === null) return value;
  const out: Record<string, unknown> = {};
  for (const [key, item] of Object.entries(value))
    out[key] = (await foreign(item, owns)) ? null : await scope(item, owns);
  return out;
}

async function namesForeign(item: unknown, owns: Owns): Promise<boolean> {
  if (typeof item !== "object" || item === null || Array.isArray(item)) return false;
  for (const field of Object.values(item)) if (await foreign(field, owns)) return true;
  return false;
}
