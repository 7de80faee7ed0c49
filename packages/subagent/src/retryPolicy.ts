import { type RetryPolicy, retryPolicySchema, STARTUP_RETRY_CAP_MS } from "./protocol/policy.js";
import { RetryPolicyUnavailableError } from "./retryPolicyMirror.js";

export { RetryPolicyMirror, RetryPolicyUnavailableError } from "./retryPolicyMirror.js";

/**
 * Where the retry policy comes from. The daemon has exactly one (its required source); a runner has only
 * the IPC mirror (retryPolicyMirror.ts). `subscribe` delivers later revisions; listeners compare revisions
 * themselves.
 */
export interface RetryPolicySource {
  read(): Promise<RetryPolicy>;
  subscribe(listener: (policy: RetryPolicy) => void): () => void;
}

/** Delay before retry number `retry` (1-based) of a startup episode: exponential, deterministic, capped. */
export function startupRetryDelayMs(policy: RetryPolicy, retry: number): number {
  if (!Number.isInteger(retry) || retry < 1)
    throw new RangeError(`retry must be a positive integer, got ${retry}`);
  const raw = policy.initialDelayMs * policy.multiplier ** (retry - 1);
  return Math.min(STARTUP_RETRY_CAP_MS, Math.round(raw));
}

/**
 * The getter bootstrap hands to the pool before the daemon's source exists. Reading it before `bind`
 * throws: there is no default policy to fall back on.
 */
export class LateBoundRetryPolicySource implements RetryPolicySource {
  #source: RetryPolicySource | undefined;

  bind(source: RetryPolicySource): void {
    if (this.#source) throw new RetryPolicyUnavailableError("retry policy source is already bound");
    this.#source = source;
  }

  get(): RetryPolicySource {
    if (!this.#source) throw new RetryPolicyUnavailableError("retry policy source read before construction");
    return this.#source;
  }

  read(): Promise<RetryPolicy> {
    return this.get().read();
  }

  subscribe(listener: (policy: RetryPolicy) => void): () => void {
    return this.get().subscribe(listener);
  }
}

/** A source held in memory: what a daemon without a policy table, tests and benchmarks use. */
export class MemoryRetryPolicySource implements RetryPolicySource {
  #policy: RetryPolicy;
  readonly #listeners = new Set<(policy: RetryPolicy) => void>();

  constructor(initial: RetryPolicy) {
    this.#policy = retryPolicySchema.parse(initial);
  }

  get listenerCount(): number {
    return this.#listeners.size;
  }

  async read(): Promise<RetryPolicy> {
    return this.#policy;
  }

  subscribe(listener: (policy: RetryPolicy) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** Commit a new revision; it must be newer than the current one. */
  commit(next: Omit<RetryPolicy, "revision">): RetryPolicy {
    const policy = retryPolicySchema.parse({ ...next, revision: this.#policy.revision + 1 });
    this.#policy = policy;
    for (const l of [...this.#listeners]) l(policy);
    return policy;
  }
}
