import { readFileSync } from "node:fs";
import { ownerTokenPath } from "../../src/index.js";

/** The daemon's whole health document as `token`'s account reads it: without one /health is liveness only. */
export async function healthWith(url: string, token: string): Promise<unknown> {
  const res = await fetch(new URL("/health", url), { headers: { authorization: `Bearer ${token}` } });
  return res.json();
}

/** The whole document as the owner reads it (the owner's token from the data directory). */
export function ownerHealth(url: string, dataDir: string): Promise<unknown> {
  return healthWith(url, readFileSync(ownerTokenPath(dataDir), "utf8").trim());
}
