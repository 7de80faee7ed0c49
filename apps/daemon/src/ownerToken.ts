import { createHash, randomBytes } from "node:crypto";
import { readFile, rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { PgDelegationRepository } from "@crw/db";

export const ownerTokenPath = (dataDir: string) => join(dataDir, "owner.token");

export const tokenHash = (token: string): Buffer => createHash("sha256").update(token, "utf8").digest();

/** A new API token: printed once to whoever asked for it; only its hash is stored. */
export const newApiToken = (): string => `crw_${randomBytes(24).toString("base64url")}`;

/**
 * The owner's API token of this data directory, in `<dataDir>/owner.token` (mode 0600), which the `crw`
 * client commands read. One owner account serves every daemon on a database: the first daemon makes it,
 * each other daemon issues a token of its own on that account, so the owner.token of any of them
 * authenticates on all. A token that still authenticates as the owner is kept.
 */
export async function ensureOwnerToken(repo: PgDelegationRepository, dataDir: string): Promise<string> {
  const path = ownerTokenPath(dataDir);
  const existing = (await readFile(path, "utf8").catch(() => "")).trim();
  if (existing && (await repo.accountByTokenHash(tokenHash(existing)))?.isOwner) return existing;
  const owner = await repo.ensureOwnerAccount();
  const token = newApiToken();
  await repo.addApiToken(owner.id, tokenHash(token), `owner token of ${dataDir}`.slice(0, 200));
  const tmp = `${path}.${process.pid}.tmp`;
  await writeFile(tmp, `${token}\n`, { mode: 0o600 });
  await rename(tmp, path);
  return token;
}
