import { createHash, randomBytes } from "node:crypto";
import { readFile, rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { PgDelegationRepository } from "@crw/db";

export const ownerTokenPath = (dataDir: string) => join(dataDir, "owner.token");

export const tokenHash = (token: string): Buffer => createHash("sha256").update(token, "utf8").digest();

/**
 * The first start makes an owner account and writes its API token to `<dataDir>/owner.token` (mode 0600),
 * which the `crw` client commands read; later starts keep it while it still authenticates. Only the hash is
 * stored in the database.
 */
export async function ensureOwnerToken(repo: PgDelegationRepository, dataDir: string): Promise<string> {
  const path = ownerTokenPath(dataDir);
  const existing = (await readFile(path, "utf8").catch(() => "")).trim();
  if (existing && (await repo.accountByTokenHash(tokenHash(existing)))) return existing;
  let account: { id: string } | undefined;
  for (let n = 0; !account; n++) {
    try {
      account = await repo.createAccount({
        name: n === 0 ? "owner" : `owner-${n + 1}`,
        isOwner: true,
        isAdministrator: true,
      });
    } catch (e) {
      if ((e as { code?: string }).code !== "conflict" || n > 50) throw e;
    }
  }
  const token = `crw_${randomBytes(24).toString("base64url")}`;
  await repo.addApiToken(account.id, tokenHash(token), "owner (made at first start)");
  const tmp = `${path}.${process.pid}.tmp`;
  await writeFile(tmp, `${token}\n`, { mode: 0o600 });
  await rename(tmp, path);
  return token;
}
