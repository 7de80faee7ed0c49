import type { CatalogModel, ModelCatalogPublication } from "./protocol/policy.js";

/**
 * The runner's publication fence for model catalogs. A `modelsChanged` frame carries the whole catalog; on
 * it the runner restores the public runtime and every prepared per-account runtime together, so a warm
 * runner serves each account the catalog its own key was last allowed to see, never another account's and
 * never a half-applied mix. Older or duplicate revisions are ignored.
 */
export class ModelCatalog {
  #revision: number;
  #public: readonly CatalogModel[];
  /** Per-account runtimes prepared by turns this runner served; only these are restored. */
  readonly #prepared = new Map<string, readonly CatalogModel[]>();
  #latest: ModelCatalogPublication;

  constructor(initial: ModelCatalogPublication) {
    this.#latest = initial;
    this.#revision = initial.revision;
    this.#public = Object.freeze([...initial.public]);
  }

  get revision(): number {
    return this.#revision;
  }

  get publicModels(): readonly CatalogModel[] {
    return this.#public;
  }

  /** The catalog for one account: prepared on first use from the newest publication. */
  forAccount(accountId: string | undefined): readonly CatalogModel[] {
    if (accountId === undefined) return this.#public;
    let runtime = this.#prepared.get(accountId);
    if (!runtime) {
      runtime = Object.freeze([...(this.#latest.accounts[accountId] ?? [])]);
      this.#prepared.set(accountId, runtime);
    }
    return runtime;
  }

  get preparedAccounts(): string[] {
    return [...this.#prepared.keys()];
  }

  /** Apply a publication; returns whether it was newer. */
  publish(next: ModelCatalogPublication): boolean {
    if (next.revision <= this.#revision) return false;
    this.#latest = next;
    this.#revision = next.revision;
    this.#public = Object.freeze([...next.public]);
    for (const accountId of [...this.#prepared.keys()]) {
      this.#prepared.set(accountId, Object.freeze([...(next.accounts[accountId] ?? [])]));
    }
    return true;
  }
}
