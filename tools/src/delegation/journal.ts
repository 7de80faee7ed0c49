import type { JournalWrite } from "@crw/db";

/**
 * Journal rows as a turn writes them, for tests that stage a journal by hand (a crashed turn's tail, a
 * turn that had finished). Tool calls name `tool` ("Work" by default).
 */
export const journalRows = {
  user: (content: string): JournalWrite => ({
    body: { type: "message", message: { role: "user", content } },
  }),
  answer: (text: string, stopReason: "stop" | "error" = "stop"): JournalWrite => ({
    body: { type: "message", message: { role: "assistant", content: [{ type: "text", text }], stopReason } },
  }),
  /** The assistant asks for one tool call. */
  asking: (id: string, tool = "Work"): JournalWrite => ({
    body: {
      type: "message",
      message: {
        role: "assistant",
        content: [{ type: "toolCall", id, name: tool, arguments: {} }],
        stopReason: "toolUse",
      },
    },
  }),
  /** The intent row a tool call journals before its effect. */
  intent: (id: string, tool = "Work"): JournalWrite => ({
    body: { type: "tool_intent", toolCallId: id, toolName: tool, arguments: {} },
  }),
  result: (id: string, content = "ok", tool = "Work"): JournalWrite => ({
    body: {
      type: "message",
      message: { role: "toolResult", toolCallId: id, toolName: tool, content, isError: false },
    },
  }),
};
