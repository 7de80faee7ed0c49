import { readFileSync } from "node:fs";
import { ownerTokenPath } from "../../src/index.js";

/**
 * The daemon's whole health document, as the owner reads it: /health without a token is liveness only.
 */
export async function ownerHealth(url: string, dataDir: string): Promise<unknown> {
  const token = readFileSync(ownerTokenPath(dataDir), "utf8").trim();
  const res = await fetch(new URL("/health", url), { headers: { authorization: `Bearer ${token}` } });
  return res.json();
}
