import type { TurnHost } from "@crw/brain";
import { toError } from "./errors.js";
import type { TurnRecord } from "./protocol/sessionTurn.js";

/**
 * A runner session turn's records as the daemon journals them. The runner sends each record one way and
 * goes on; here they are written in the order they came, one at a time, and every answered call of the turn
 * (an intent, a steering drain, a host tool) and the turn's outcome wait for the records sent before them,
 * so nothing the turn does next comes before a message it recorded (an intent never before the assistant
 * message that asked for it). A record that fails skips the ones after it: the turn's next call, or its
 * outcome, fails with that record's error, as the runner's own await of the write used to.
 */
export class TurnRecords {
  #chain: Promise<void> = Promise.resolve();
  #failed: Error | undefined;

  constructor(private readonly host: TurnHost) {}

  add(record: TurnRecord): void {
    this.#chain = this.#chain.then(async () => {
      if (this.#failed !== undefined) return;
      try {
        await this.host.record(record.message, record.usage ? { usage: record.usage } : undefined);
      } catch (e) {
        this.#failed = toError(e);
      }
    });
  }

  /** Once every record added so far is written or skipped: the first failure, if any. */
  async written(): Promise<Error | undefined> {
    await this.#chain;
    return this.#failed;
  }
}
