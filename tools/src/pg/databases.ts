import { randomBytes } from "node:crypto";
import pg from "pg";

/** The connection string of database `name` on the server that `adminUrl` reaches. */
export function databaseUrl(adminUrl: string, name: string): string {
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return url.toString();
}

export function uniqueDatabaseName(prefix: string): string {
  return `${prefix}_${process.pid}_${randomBytes(4).toString("hex")}`;
}

async function withAdmin<T>(adminUrl: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

// object_in_use: two CREATE DATABASE … TEMPLATE at once can find the template busy, and a DROP DATABASE
// can find clients still closing; both are worth a short retry.
const OBJECT_IN_USE = "55006";

export async function createDatabase(adminUrl: string, name: string, template?: string): Promise<string> {
  await withAdmin(adminUrl, async (client) => {
    for (let attempt = 0; ; attempt++) {
      try {
        await client.query(`create database "${name}"${template ? ` template "${template}"` : ""}`);
        return;
      } catch (e) {
        const code = (e as { code?: string }).code;
        if (code !== OBJECT_IN_USE || attempt >= 20) throw e;
        await new Promise((r) => setTimeout(r, 50 * (attempt + 1)));
      }
    }
  });
  return databaseUrl(adminUrl, name);
}

export async function dropDatabase(adminUrl: string, name: string): Promise<void> {
  // A test's own clients may still be closing (a pool ended without awaiting it, a LISTEN connection):
  // give them a moment before forcing, since a forced drop makes each of them emit an error that nobody
  // listens to any more and that fails the test run after its tests passed.
  await withAdmin(adminUrl, async (client) => {
    for (let attempt = 0; attempt < 30; attempt++) {
      try {
        await client.query(`drop database if exists "${name}"`);
        return;
      } catch (e) {
        if ((e as { code?: string }).code !== OBJECT_IN_USE) throw e;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    await client.query(`drop database if exists "${name}" with (force)`);
  });
}
