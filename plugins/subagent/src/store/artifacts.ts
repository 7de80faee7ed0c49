import { createHash } from "node:crypto";
import {
  grantWorkflowArtifact,
  grantWorkflowArtifacts,
  putWorkflowArtifactGranted,
  readWorkflowArtifact,
  type WorkflowArtifactKey,
  workflowArtifactGrants,
} from "@crw/db";
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

/** The address of a stored artifact version. */
const refOf = (a: WorkflowArtifactKey): ArtifactRef => ({
  workflowId: a.workflowId,
  nodeId: a.nodeId,
  sha256: a.sha256,
  path: workflowArtifactPath(a.workflowId, a.nodeId, a.sha256),
});

/** Shared result artifacts and their recipient grants, addressed by their canonical paths. */
export class PgArtifactStore {
  constructor(readonly pool: pg.Pool) {}

  /**
   * Stores a node's result (a retry of the same content is a no-op) and grants that version to
   * `recipientSessionId`, in one statement (one commit): the grant can never name another version.
   */
  async putArtifactGranted(
    workflowId: string,
    nodeId: string,
    body: string,
    recipientSessionId: string,
  ): Promise<{ sha256: string; byteSize: number }> {
    const sha256 = sha256Hex(body);
    const byteSize = Buffer.byteLength(body);
    await putWorkflowArtifactGranted(
      this.pool,
      { workflowId, nodeId, sha256, byteSize, body },
      recipientSessionId,
    );
    return { sha256, byteSize };
  }

  /**
   * `grant` for several artifacts of one workflow to one recipient, in one statement. Returns the node ids
   * granted: an artifact whose hash is not stored is left out (no grant names a path by itself).
   */
  grantMany(
    workflowId: string,
    artifacts: readonly { nodeId: string; sha256: string }[],
    recipientSessionId: string,
  ): Promise<Set<string>> {
    return grantWorkflowArtifacts(this.pool, workflowId, artifacts, recipientSessionId);
  }

  /**
   * Mints a recipient's grant for the stored artifact of `nodeId` whose hash is `sha256` (both from the
   * journal). Refused (null) when no artifact of that hash is stored: no grant names a path by itself.
   */
  async grant(
    workflowId: string,
    nodeId: string,
    sha256: string,
    recipientSessionId: string,
  ): Promise<ArtifactRef | null> {
    const key = { workflowId, nodeId, sha256 };
    return (await grantWorkflowArtifact(this.pool, key, recipientSessionId)) ? refOf(key) : null;
  }

  /** The artifact at `path`, when `sessionId` holds a grant for exactly that version. */
  async readArtifact(sessionId: string, path: string): Promise<string | null> {
    const match = /^workflow-artifacts\/([0-9a-f-]{36})\/([^/]+)\/([0-9a-f]{64})$/.exec(path);
    if (!match) return null;
    const [, workflowId = "", nodeId = "", sha256 = ""] = match;
    return readWorkflowArtifact(this.pool, sessionId, { workflowId, nodeId, sha256 });
  }

  async grantsOf(sessionId: string): Promise<ArtifactRef[]> {
    return (await workflowArtifactGrants(this.pool, sessionId)).map(refOf);
  }
}
