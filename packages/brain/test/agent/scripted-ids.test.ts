import { describe, expect, it } from "vitest";
import { scriptedProviderReply } from "../../src/agent/index.js";

type Reply = ReturnType<typeof scriptedProviderReply>;
const model = { api: "scripted", provider: "scripted", id: "scripted-model" } as Parameters<
  typeof scriptedProviderReply
>[0];
type Context = Parameters<typeof scriptedProviderReply>[2];

const delegateScript = JSON.stringify({
  steps: [{ toolCalls: [{ name: "Delegate", arguments: { task: "t" } }] }],
});
const user = (text: string) => ({ role: "user" as const, content: text, timestamp: 0 });
const toolIds = (reply: Reply) => reply.content.flatMap((c) => (c.type === "toolCall" ? [c.id] : []));

describe("the scripted provider's tool call ids", () => {
  it("are numbered by the reply's place in the whole transcript: a second prompt of one session gets new ids", () => {
    const first = scriptedProviderReply(model, [], { messages: [user(delegateScript)] } as Context);
    const second = scriptedProviderReply(model, [], {
      messages: [user(delegateScript), first, user(delegateScript)],
    } as unknown as Context);
    expect(toolIds(first)).toHaveLength(1);
    expect(toolIds(second)).toHaveLength(1);
    expect(toolIds(second)[0]).not.toBe(toolIds(first)[0]);
  });

  it("are the same when the same transcript is replayed (recovery asks again)", () => {
    const context = { messages: [user(delegateScript)] } as Context;
    expect(toolIds(scriptedProviderReply(model, [], context))).toEqual(
      toolIds(scriptedProviderReply(model, [], context)),
    );
  });
});
