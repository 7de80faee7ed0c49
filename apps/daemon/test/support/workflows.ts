import type { TestClient } from "./client.js";

/**
 * Starts a two-node workflow (NODE-one, then NODE-two) under the session: what the crash and takeover
 * tests hold mid-node through their model server, which answers by the NODE tag in the task.
 */
export async function startTwoNodeWorkflow(
  client: TestClient,
  sessionId: string,
  name: string,
): Promise<string> {
  const { workflowId } = await client.ok<{ workflowId: string }>("workflow.start", {
    sessionId,
    format: "json",
    definition: JSON.stringify({
      name,
      nodes: [
        { id: "one", task: "NODE-one: first" },
        { id: "two", task: "NODE-two: second", dependsOn: ["one"] },
      ],
    }),
  });
  return workflowId;
}
