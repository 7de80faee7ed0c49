/**
 * A foreground call's stall watchdog: progress renews it (a timestamp, no timer per event); when it has
 * seen none for `afterMs`, `onStall` runs with the silence so far and says whether the call was let go.
 * A call that could not be let go is watched again from then on. Its timer never keeps a process alive.
 */
export class StallWatchdog {
  #timer: ReturnType<typeof setTimeout> | null = null;
  #last = Date.now();
  #stopped = false;

  constructor(
    private readonly afterMs: number,
    private readonly onStall: (silentMs: number) => Promise<boolean>,
  ) {}

  start(): void {
    this.#last = Date.now();
    this.#arm(this.afterMs);
  }

  renew(): void {
    this.#last = Date.now();
  }

  stop(): void {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
  }

  #arm(ms: number): void {
    if (this.#stopped) return;
    this.#timer = setTimeout(() => void this.#check(), ms);
    this.#timer.unref?.();
  }

  async #check(): Promise<void> {
    if (this.#stopped) return;
    const silent = Date.now() - this.#last;
    if (silent < this.afterMs) {
      this.#arm(this.afterMs - silent);
      return;
    }
    let letGo = false;
    try {
      letGo = await this.onStall(silent);
    } catch {
      // watched again below: a failed attempt to let the caller go leaves it waiting
    }
    if (!letGo) {
      this.#last = Date.now();
      this.#arm(this.afterMs);
    }
  }
}
