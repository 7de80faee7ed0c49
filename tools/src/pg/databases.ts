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

// Two CREATE DATABASE … TEMPLATE at once can find the template busy (55006); that alone is worth a retry.
const TEMPLATE_BUSY = "55006";

export async function createDatabase(adminUrl: string, name: string, template?: string): Promise<string> {
  await withAdmin(adminUrl, async (client) => {
    for (let attempt = 0; ; attempt++) {
      try {
        await client.query(`create database "${name}"${template ? ` template "${template}"` : ""}`);
        return;
      } catch (e) {
        const code = (e as { code?: string }).code;
        if (code !== TEMPLATE_BUSY || attempt >= 20) throw e;
        await new Promise((r) => setTimeout(r, 50 * (attempt + 1)));
      }
    }
  });
  return databaseUrl(adminUrl, name);
}

export async function dropDatabase(adminUrl: string, name: string): Promise<void> {
  await withAdmin(adminUrl, (client) => client.query(`drop database if exists "${name}" with (force)`));
}
