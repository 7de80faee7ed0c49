import { SubagentError } from "./errors.js";
import type { RetryPolicy } from "./protocol/policy.js";
import type { RetryPolicySource } from "./retryPolicy.js";

// Apart from retryPolicy.ts: a runner boots with this mirror and must not load the policy schema to do so.

export class RetryPolicyUnavailableError extends SubagentError {
  override readonly name = "RetryPolicyUnavailableError";
  readonly code = "retry_policy_unavailable" as const;
  readonly retryable = false;
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
