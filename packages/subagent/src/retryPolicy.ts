import { SubagentError } from "./errors.js";
import { type RetryPolicy, retryPolicySchema, STARTUP_RETRY_CAP_MS } from "./protocol/policy.js";

/**
 * Where the retry policy comes from. The daemon has exactly one (its required source); a runner has only
 * the IPC mirror below. `subscribe` delivers later revisions; listeners compare revisions themselves.
 */
export interface RetryPolicySource {
  read(): Promise<RetryPolicy>;
  subscribe(listener: (policy: RetryPolicy) => void): () => void;
}

export class RetryPolicyUnavailableError extends SubagentError {
  override readonly name = "RetryPolicyUnavailableError";
  readonly code = "retry_policy_unavailable" as const;
  readonly retryable = false;
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

/**
 * The runner's only view of the policy: seeded by the boot frame, advanced by retryPolicyChanged frames.
 * A strictly older or duplicate revision never rewinds it; after dispose, reads and subscriptions reject.
 */
export class RetryPolicyMirror implements RetryPolicySource {
  #policy: RetryPolicy;
  #disposed = false;
  readonly #listeners = new Set<(policy: RetryPolicy) => void>();

  constructor(boot: RetryPolicy) {
    this.#policy = boot;
  }

  get revision(): number {
    return this.#policy.revision;
  }

  async read(): Promise<RetryPolicy> {
    if (this.#disposed) throw new RetryPolicyUnavailableError("retry policy mirror is disposed");
    return this.#policy;
  }

  subscribe(listener: (policy: RetryPolicy) => void): () => void {
    if (this.#disposed) throw new RetryPolicyUnavailableError("retry policy mirror is disposed");
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** Apply an IPC revision; returns whether it advanced the mirror. */
  update(next: RetryPolicy): boolean {
    if (this.#disposed || next.revision <= this.#policy.revision) return false;
    this.#policy = next;
    for (const l of [...this.#listeners]) l(next);
    return true;
  }

  dispose(): void {
    this.#disposed = true;
    this.#listeners.clear();
  }
}
