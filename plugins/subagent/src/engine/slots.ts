/**
 * The engine-wide cap on executing nodes. A fresh dispatch waits for a free slot (its node stays pending);
 * recovery continuations are never held back but count against the cap.
 */
export class NodeSlots {
  #used = 0;
  readonly #waiting = new Set<{ pump(): void }>();
  constructor(readonly max: number) {}

  get used(): number {
    return this.#used;
  }

  acquire(run: { pump(): void }, force: boolean): boolean {
    if (!force && this.#used >= this.max) {
      this.#waiting.add(run);
      return false;
    }
    this.#used += 1;
    return true;
  }

  release(): void {
    this.#used -= 1;
    const runs = [...this.#waiting];
    this.#waiting.clear();
    for (const r of runs) r.pump();
  }
}
