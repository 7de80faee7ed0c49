/** Startup retry timing never waits longer than this between two attempts. */
export const STARTUP_RETRY_CAP_MS = 60_000;
