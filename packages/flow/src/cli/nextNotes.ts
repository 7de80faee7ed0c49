import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { OwnerView } from "../run/ownerView.js";
import { writeFileAtomic } from "../util/fsx.js";

/**
 * What `crw flow next` adds to the run's state for an owner that is stuck: the decision a paused run
 * waits for (its question names the fix), the diagnosis of a host the run cannot reach, and a note when
 * the owner keeps asking with nothing new (kept in `next-seen.json`, never in the journal).
 */
export interface HostDown {
  reachable: false;
  host: string;
  why: string;
  fix: string;
}

/** The run's newest host_unreachable warning when no host_reachable came after it. */
export function hostDown(view: OwnerView): HostDown | null {
  return view.hostDown ? { reachable: false, ...view.hostDown } : null;
}

export interface Decision {
  id: string;
  question: string;
  options?: unknown;
}

export function decisionOf(view: OwnerView, id: string): Decision | null {
  const d = view.decisions[id];
  return d ? { id, ...d } : null;
}

/** How many asks in a row (without --wait) saw this same answer; after 3 the hint says so. */
export const SAME_ASKS_NOTE = 3;

export function sameAsks(dir: string, digest: string, waited: boolean): number {
  const file = join(dir, "next-seen.json");
  let seen = { digest: "", count: 0 };
  try {
    seen = JSON.parse(readFileSync(file, "utf8")) as typeof seen;
  } catch {
    // first ask
  }
  const count = !waited && seen.digest === digest ? seen.count + 1 : 1;
  try {
    writeFileAtomic(file, `${JSON.stringify({ digest, count })}\n`);
  } catch {
    // a state directory that cannot be written loses only this note
  }
  return count;
}
