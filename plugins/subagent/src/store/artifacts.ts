import { createHash } from "node:crypto";
import type pg from "pg";
import { NODE_ID_PATTERN } from "../definition/schema.js";

/**
 * The canonical address of a node's shared result artifact, derived only from stored ids and the content
 * hash (never from a caller-supplied path): `workflow-artifacts/<workflowId>/<nodeId>/<sha256>`.
 */
export function workflowArtifactPath(workflowId: string, nodeId: string, sha256: string): string {
  if (
    !/^[0-9a-f-]{36}$/.test(workflowId) ||
    !NODE_ID_PATTERN.test(nodeId) ||
    !/^[0-9a-f]{64}$/.test(sha256)
  ) {
    throw new TypeError("workflowArtifactPath takes a stored workflow id, node id and sha256");
  }
  return `workflow-artifacts/${workflowId}/${nodeId}/${sha256}`;
}

export function sha256Hex(text: string): string {
  return createHash("sha256").update(text).digest("hex");
}

export interface ArtifactRef {
  readonly workflowId: string;
  readonly nodeId: string;
  readonly sha256: string;
  readonly path: string;
}

/** Shared result artifacts and their recipient grants; planned node sessions (children without a run row). */
export class PgArtifactStore {
  constructor(readonly pool: pg.Pool) {}

  /**
   * Stores a node's result (a retry of the same content is a no-op) and grants that version to
   * `recipientSessionId`, in one statement (one commit): the grant names the row the same statement
   * stored, so it can never name another version.
   */
  async putArtifactGranted(
    workflowId: string,
    nodeId: string,
    body: string,
    recipientSessionId: string,
  ): Promise<{ sha256: string; byteSize: number }> {
    const sha256 = sha256Hex(body);
    const byteSize = Buffer.byteLength(body);
    await this.pool.query(
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
    return { sha256, byteSize };
  }

  /**
   * `grant` for several artifacts of one workflow to one recipient, in one statement. Returns the node ids
   * granted: an artifact whose hash is not stored is left out (no grant names a path by itself).
   */
  async grantMany(
    workflowId: string,
    artifacts: readonly { nodeId: string; sha256: string }[],
    recipientSessionId: string,
  ): Promise<Set<string>> {
    if (artifacts.length === 0) return new Set();
    const { rows } = await this.pool.query<{ node_id: string }>(
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

  /**
   * Mints a recipient's grant for the stored artifact of `nodeId` whose hash is `sha256` (both from the
   * journal). Refused (false) when no artifact of that hash is stored: no grant names a path by itself.
   */
  async grant(
    workflowId: string,
    nodeId: string,
    sha256: string,
    recipientSessionId: string,
  ): Promise<ArtifactRef | null> {
    const { rowCount } = await this.pool.query(
      `insert into workflow_artifact_grants (workflow_id, node_id, sha256, recipient_session_id)
       select a.workflow_id, a.node_id, a.sha256, $4::uuid from workflow_artifacts a
        where a.workflow_id = $1::uuid and a.node_id = $2 and a.sha256 = $3
       on conflict (workflow_id, node_id, recipient_session_id) do update set sha256 = excluded.sha256`,
      [workflowId, nodeId, sha256, recipientSessionId],
    );
    return rowCount === 1
      ? { workflowId, nodeId, sha256, path: workflowArtifactPath(workflowId, nodeId, sha256) }
      : null;
  }

  /** The artifact at `path`, when `sessionId` holds a grant for exactly that version. */
  async readArtifact(sessionId: string, path: string): Promise<string | null> {
    const match = /^workflow-artifacts\/([0-9a-f-]{36})\/([^/]+)\/([0-9a-f]{64})$/.exec(path);
    if (!match) return null;
    const { rows } = await this.pool.query<{ body: string }>(
      `select a.body from workflow_artifacts a
         join workflow_artifact_grants g on g.workflow_id = a.workflow_id and g.node_id = a.node_id and g.sha256 = a.sha256
        where a.workflow_id = $1::uuid and a.node_id = $2 and a.sha256 = $3 and g.recipient_session_id = $4::uuid`,
      [match[1], match[2], match[3], sessionId],
    );
    return rows[0]?.body ?? null;
  }

  async grantsOf(sessionId: string): Promise<ArtifactRef[]> {
    const { rows } = await this.pool.query<{ workflow_id: string; node_id: string; sha256: string }>(
      "select workflow_id, node_id, sha256 from workflow_artifact_grants where recipient_session_id = $1::uuid order by node_id",
      [sessionId],
    );
    return rows.map((r) => ({
      workflowId: r.workflow_id,
      nodeId: r.node_id,
      sha256: r.sha256,
      path: workflowArtifactPath(r.workflow_id, r.node_id, r.sha256),
    }));
  }
}
