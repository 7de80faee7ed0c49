import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";

/**
 * A build's identity: the digest of the runner entry file. The daemon captures it once (per startup episode)
 * from the file it is about to fork; the runner computes it from the file it is running. Different bytes on
 * either side (an upgrade on disk under a running daemon) is skew, refused by the handshake. The entry
 * names each chunk it imports after boot by content hash (tsup.config.ts), so its digest covers them too.
 */
export function buildIdentityOf(file: string): string {
  return `crw-runner-${createHash("sha256").update(readFileSync(file)).digest("hex").slice(0, 32)}`;
}
