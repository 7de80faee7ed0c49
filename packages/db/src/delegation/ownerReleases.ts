import type pg from "pg";
import { type ChannelListener, listenOnChannel } from "../listen.js";
import { OWNER_RELEASED_CHANNEL } from "./recovery.js";

export type OwnerReleaseListener = ChannelListener;

/**
 * Listens for owner leases let go by live processes: `onReleased` gets each released owner id;
 * `onListening` runs each time the listener is (again) in place, so a caller can sweep for what a lost
 * connection may have missed.
 */
export function listenForOwnerReleases(
  pool: pg.Pool,
  onReleased: (owner: string) => void,
  onListening: () => void,
  onError: (e: unknown) => void,
): Promise<OwnerReleaseListener> {
  return listenOnChannel(pool, OWNER_RELEASED_CHANNEL, { onPayload: onReleased, onListening, onError });
}
