import pg from "pg";

/**
 * Creates database `name` on the server `url` connects to (through a database that always exists, such as
 * `postgres`) unless it exists already.
 */
export async function ensureDatabase(url: string, name: string): Promise<void> {
  // The name goes into the statement as it is: a plain identifier only.
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(name)) throw new Error(`not a plain database name: ${name}`);
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rowCount } = await client.query("select 1 from pg_database where datname = $1", [name]);
    if (!rowCount) await client.query(`create database ${name}`);
  } finally {
    await client.end();
  }
}
