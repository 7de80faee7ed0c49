import type { SessionRow } from "@crw/db";
import { describe, expect, it } from "vitest";
import { workflowTools } from "../src/index.js";

// The declared argument schemas are the input side of each tool's zod schema: a field with a default or
// an optional one is not required from the model.
describe("workflow tool argument schemas", () => {
  const session = { id: "00000000-0000-4000-8000-000000000001", principalAccountId: "a" } as SessionRow;
  const engine = { nodeOfSession: () => undefined } as never;
  const tools = workflowTools({
    service: {} as never,
    engine,
    session,
    readOnly: false,
    reader: null,
    currentWorkDir: async () => null,
  });
  const schema = (name: string) =>
    tools.find((t) => t.name === name)?.parameters as {
      required?: string[];
      properties: Record<string, unknown>;
    };

  it("WorkflowStart requires only the path; foreground has its default and is optional", () => {
    expect(schema("WorkflowStart").required).toEqual(["path"]);
    expect(schema("WorkflowStart").properties.foreground).toMatchObject({ type: "boolean", default: false });
  });

  it("WorkflowResume and WorkflowCancel require the workflow id", () => {
    expect(schema("WorkflowResume").required).toEqual(["workflowId"]);
    expect(schema("WorkflowCancel").required).toEqual(["workflowId"]);
  });
});
