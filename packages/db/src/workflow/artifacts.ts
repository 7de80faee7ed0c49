import type pg from "pg";

// Shared result artifacts of workflow nodes, and the grants that let a recipient session read one version.

/** An artifact version as stored (the caller derives its path). */
export interface WorkflowArtifactKey {
  readonly workflowId: string;
  readonly nodeId: string;
  readonly sha256: string;
}

/**
 * Stores a node's result (a retry of the same content is a no-op) and grants that version to
 * `recipientSessionId`, in one statement (one commit): the grant names the row the same statement
 * stored, so it can never name another version.
 */
export async function putWorkflowArtifactGranted(
  pool: pg.Pool,
  artifact: WorkflowArtifactKey & { byteSize: number; body: string },
  recipientSessionId: string,
): Promise<void> {
  const { workflowId, nodeId, sha256, byteSize, body } = artifact;
  await pool.query(
    `with stored as (
         insert into workflow_artifacts (workflow_id, node_id, sha256, byte_size, body)
         values ($1::uuid, $2, $3, $4, $5)
         on conflict (workflow_id, node_id) do update set sha256 = excluded.sha256,
                byte_size = excluded.byte_size, body = excluded.body, created_at = now()
         returning workflow_id, node_id, sha256)
       insert into workflow_artifact_grants (workflow_id, node_id, sha256, recipient_session_id)
       select workflow_id, node_id, sha256, $6::uuid from stored
       on conflict (workflow_id, node_id, recipient_session_id) do update set sha256 = excluded.sha256`,
    [workflowId, nodeId, sha256, byteSize, body, recipientSessionId],
  );
}

/**
 * Grants several stored artifacts of one workflow to one recipient, in one statement. Returns the node ids
 * granted: an artifact whose hash is not stored is left out (no grant names a path by itself).
 */
export async function grantWorkflowArtifacts(
  pool: pg.Pool,
  workflowId: string,
  artifacts: readonly { nodeId: string; sha256: string }[],
  recipientSessionId: string,
): Promise<Set<string>> {
  if (artifacts.length === 0) return new Set();
  const { rows } = await pool.query<{ node_id: string }>(
    `insert into workflow_artifact_grants (workflow_id, node_id, sha256, recipient_session_id)
       select a.workflow_id, a.node_id, a.sha256, $4::uuid
         from unnest($2::text[], $3::text[]) as want(node_id, sha256)
         join workflow_artifacts a
           on a.workflow_id = $1::uuid and a.node_id = want.node_id and a.sha256 = want.sha256
       on conflict (workflow_id, node_id, recipient_session_id) do update set sha256 = excluded.sha256
       returning node_id`,
    [workflowId, artifacts.map((a) => a.nodeId), artifacts.map((a) => a.sha256), recipientSessionId],
  );
  return new Set(rows.map((r) => r.node_id));
}

/** Grants one stored artifact version to a recipient; false when no artifact of that hash is stored. */
export async function grantWorkflowArtifact(
  pool: pg.Pool,
  artifact: WorkflowArtifactKey,
  recipientSessionId: string,
): Promise<boolean> {
  const { rowCount } = await pool.query(
    `insert into workflow_artifact_grants (workflow_id, node_id, sha256, recipient_session_id)
       select a.workflow_id, a.node_id, a.sha256, $4::uuid from workflow_artifacts a
        where a.workflow_id = $1::uuid and a.node_id = $2 and a.sha256 = $3
       on conflict (workflow_id, node_id, recipient_session_id) do update set sha256 = excluded.sha256`,
    [artifact.workflowId, artifact.nodeId, artifact.sha256, recipientSessionId],
  );
  return rowCount === 1;
}

/** The body of an artifact version, when `sessionId` holds a grant for exactly that version. */
export async function readWorkflowArtifact(
  pool: pg.Pool,
  sessionId: string,
  artifact: WorkflowArtifactKey,
): Promise<string | null> {
  const { rows } = await pool.query<{ body: string }>(
    `select a.body from workflow_artifacts a
         join workflow_artifact_grants g on g.workflow_id = a.workflow_id and g.node_id = a.node_id and g.sha256 = a.sha256
        where a.workflow_id = $1::uuid and a.node_id = $2 and a.sha256 = $3 and g.recipient_session_id = $4::uuid`,
    [artifact.workflowId, artifact.nodeId, artifact.sha256, sessionId],
  );
  return rows[0]?.body ?? null;
}

/** The artifact versions granted to a session, by node id. */
export async function workflowArtifactGrants(
  pool: pg.Pool,
  sessionId: string,
): Promise<WorkflowArtifactKey[]> {
  const { rows } = await pool.query<{ workflow_id: string; node_id: string; sha256: string }>(
    "select workflow_id, node_id, sha256 from workflow_artifact_grants where recipient_session_id = $1::uuid order by node_id",
    [sessionId],
  );
  return rows.map((r) => ({ workflowId: r.workflow_id, nodeId: r.node_id, sha256: r.sha256 }));
}
