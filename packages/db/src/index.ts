export { migrate, migrationsDir, migrationsTable } from "./migrate.js";
