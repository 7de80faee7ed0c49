import { createHash } from "node:crypto";
import pg from "pg";

/** Statements one connection keeps prepared; a statement past this many goes unnamed (parsed each time). */
const MAX_PREPARED_PER_CONNECTION = 512;

const names = new Map<string, string>();

/** A stable name for a statement's text: the same text prepares once per connection. */
function statementName(text: string): string {
  let name = names.get(text);
  if (name === undefined) {
    name = `crw_${createHash("sha1").update(text).digest("base64url").slice(0, 20)}`;
    // The map holds the texts this process issues; past the bound a text is hashed each time instead.
    if (names.size < 4 * MAX_PREPARED_PER_CONNECTION) names.set(text, name);
  }
  return name;
}

/**
 * A client class that sends each parameterized statement as a named prepared statement: the server parses
 * and plans it once per connection instead of once per call, which is most of a short statement's server
 * time. Statements without parameters (begin, commit) stay simple queries. The count per connection is
 * bounded, so a statement whose text varies cannot grow a connection's memory without end. Made on first
 * use: a process that never opens a pool (a runner) never loads pg for it.
 */
let preparingClient: typeof pg.Client | undefined;
function preparingClientClass(): typeof pg.Client {
  preparingClient ??= class PreparingClient extends pg.Client {
    readonly #prepared = new Set<string>();

    // biome-ignore lint/suspicious/noExplicitAny: pg's own overloads, passed on unchanged.
    override query(config: any, values?: any, callback?: any): any {
      if (typeof config === "string" && Array.isArray(values)) {
        const name = statementName(config);
        if (this.#prepared.has(name) || this.#prepared.size < MAX_PREPARED_PER_CONNECTION) {
          this.#prepared.add(name);
          return super.query({ name, text: config, values }, callback);
        }
      }
      return super.query(config, values, callback);
    }
  };
  return preparingClient;
}

/**
 * A pool of preparing clients: what crw's repositories run on. An idle connection is kept (pg closes it after
 * 10 s by default): a connection is its server backend with its catalog caches and this pool's prepared
 * statements, so a burst of work after a quiet spell would otherwise pay for new backends, their
 * authentication and every statement's preparation again. Kept connections do not hold a process open.
 */
export function createPool(config: pg.PoolConfig): pg.Pool {
  return new pg.Pool({
    idleTimeoutMillis: 0,
    allowExitOnIdle: true,
    ...config,
    Client: preparingClientClass(),
  });
}
