import type pg from "pg";
import { DelegationDbError } from "../errors.js";
import { assertUuid } from "./rows.js";

/** A directory of this host registered under a name; `accounts` are the ones granted it (besides operators). */
export interface Project {
  readonly ref: string;
  readonly root: string;
  readonly accounts: readonly string[];
  readonly createdAt: Date;
}

interface ProjectRow {
  ref: string;
  root: string;
  accounts: string[] | null;
  created_at: Date;
}

const fromRow = (r: ProjectRow): Project => ({
  ref: r.ref,
  root: r.root,
  accounts: r.accounts ?? [],
  createdAt: r.created_at,
});

const SELECT = `select p.ref, p.root, p.created_at,
  (select array_agg(g.account_id::text order by g.account_id) from project_grants g where g.project_ref = p.ref) as accounts
  from projects p`;

/** Registers `root` as project `ref`; registering the same pair again is a no-op, another pair a conflict. */
export async function addProject(pool: pg.Pool, ref: string, root: string): Promise<Project> {
  try {
    await pool.query("insert into projects (ref, root) values ($1, $2) on conflict (ref) do nothing", [
      ref,
      root,
    ]);
  } catch (e) {
    const code = (e as { code?: string }).code;
    if (code === "23505")
      throw new DelegationDbError("conflict", `${root} is registered as another project`, { ref, root });
    if (code === "23514")
      throw new DelegationDbError(
        "invalid_input",
        "a project name is 1..64 letters, digits, '.', '_' or '-'",
        { ref },
      );
    throw e;
  }
  const project = await getProject(pool, ref);
  if (!project || project.root !== root)
    throw new DelegationDbError("conflict", `project ${ref} is registered for ${project?.root}`, {
      ref,
      root,
    });
  return project;
}

export async function grantProject(pool: pg.Pool, ref: string, accountId: string): Promise<void> {
  assertUuid("accountId", accountId);
  try {
    await pool.query(
      "insert into project_grants (project_ref, account_id) values ($1, $2::uuid) on conflict do nothing",
      [ref, accountId],
    );
  } catch (e) {
    if ((e as { code?: string }).code === "23503")
      throw new DelegationDbError("not_found", `no project ${ref} or no such account`, { ref, accountId });
    throw e;
  }
}

export async function getProject(pool: pg.Pool, ref: string): Promise<Project | null> {
  const { rows } = await pool.query<ProjectRow>(`${SELECT} where p.ref = $1`, [ref]);
  return rows[0] ? fromRow(rows[0]) : null;
}

export async function listProjects(pool: pg.Pool): Promise<Project[]> {
  const { rows } = await pool.query<ProjectRow>(`${SELECT} order by p.ref`);
  return rows.map(fromRow);
}

/** The innermost registered project whose root is `dir` or a directory above it. */
export async function projectForPath(pool: pg.Pool, dir: string): Promise<Project | null> {
  const { rows } = await pool.query<ProjectRow>(
    `${SELECT} where p.root = $1 or starts_with($1, rtrim(p.root, '/') || '/') order by length(p.root) desc limit 1`,
    [dir],
  );
  return rows[0] ? fromRow(rows[0]) : null;
}
