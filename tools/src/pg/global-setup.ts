import { migrate } from "@crw/db";
import type { TestProject } from "vitest/node";
import { createDatabase, dropDatabase, uniqueDatabaseName } from "./databases.js";
import { acquirePostgres } from "./server.js";
import "./provided.js";

/** One server for the whole run, one migrated template database that each test file clones. */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const server = await acquirePostgres();
  const template = uniqueDatabaseName("crw_tpl");
  const url = await createDatabase(server.adminUrl, template);
  try {
    await migrate(url);
  } catch (e) {
    await dropDatabase(server.adminUrl, template).catch(() => {});
    await server.stop();
    throw e;
  }
  project.provide("crwPgAdminUrl", server.adminUrl);
  project.provide("crwPgTemplate", template);
  return async () => {
    await dropDatabase(server.adminUrl, template).catch(() => {});
    await server.stop();
  };
}
