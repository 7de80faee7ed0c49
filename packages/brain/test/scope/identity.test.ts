import { describe, expect, it } from "vitest";
import {
  captureDelegatedExecutionScope,
  forDelegatedTurn,
  parseDelegatedExecutionScope,
} from "../../src/scope/index.js";

const dream = { runId: "dream-7", accountUserId: "acct-1" };
const base = { accountId: "acct-1", target: { kind: "host", ref: null } };
const dreamScope = parseDelegatedExecutionScope(
  captureDelegatedExecutionScope(base, { accountId: "acct-1", dream }),
);
const ordinary = parseDelegatedExecutionScope(captureDelegatedExecutionScope(base));
const ownConversation = {
  sessionId: "p1",
  accountId: "acct-1",
  kind: "root",
  continuation: false,
  channelId: null,
} as const;

describe("IdentityResolver.forDelegatedTurn", () => {
  it("memory identity only when the scope carries a dream AND the parent is the account's own top-level conversation (S004-571)", () => {
    expect(forDelegatedTurn(dreamScope, ownConversation)).toEqual({
      principalAccountId: "acct-1",
      memoryIdentity: { elowenUserId: "acct-1", dreamRunId: "dream-7" },
    });
    expect(forDelegatedTurn(ordinary, ownConversation).memoryIdentity).toBeUndefined();
  });

  it("the parent proof: the named account's, not a continuation, not a delegated child, not a brain-ch-* room (S004-572)", () => {
    expect(
      forDelegatedTurn(dreamScope, { ...ownConversation, accountId: "acct-2" }).memoryIdentity,
    ).toBeUndefined();
    expect(
      forDelegatedTurn(dreamScope, { ...ownConversation, continuation: true }).memoryIdentity,
    ).toBeUndefined();
    expect(
      forDelegatedTurn(dreamScope, { ...ownConversation, kind: "delegated" }).memoryIdentity,
    ).toBeUndefined();
    expect(
      forDelegatedTurn(dreamScope, { ...ownConversation, channelId: "brain-ch-team" }).memoryIdentity,
    ).toBeUndefined();
    expect(
      forDelegatedTurn(dreamScope, { ...ownConversation, channelId: "direct-1" }).memoryIdentity,
    ).toBeDefined();
  });

  it("every ordinary delegated child gets no memory identity, whatever its parent (S004-573)", () => {
    for (const parent of [
      ownConversation,
      { ...ownConversation, kind: "delegated" as const },
      { ...ownConversation, channelId: "brain-ch-x" },
    ]) {
      expect(forDelegatedTurn(ordinary, parent)).toEqual({ principalAccountId: "acct-1" });
    }
  });

  it("the memory identity is never stored in the scope: the same stored scope gives it or not by the parent facts given", () => {
    const stored = captureDelegatedExecutionScope(base, { accountId: "acct-1", dream });
    expect(stored).not.toContain("elowenUserId");
    expect(stored).not.toContain("memoryIdentity");
    // The same stored scope yields identity or not according to the parent as it is now.
    const scope = parseDelegatedExecutionScope(stored);
    expect(forDelegatedTurn(scope, ownConversation).memoryIdentity).toBeDefined();
    expect(
      forDelegatedTurn(scope, { ...ownConversation, continuation: true }).memoryIdentity,
    ).toBeUndefined();
    expect(forDelegatedTurn(scope, ownConversation).memoryIdentity).toBeDefined();
  });

  it("a dream marker is no authority over the account: it changes no tool, boundary or operator power", () => {
    expect(dreamScope.tools).toEqual(ordinary.tools);
    expect(dreamScope.permissionBoundary).toBe(ordinary.permissionBoundary);
    expect(dreamScope.operator).toBe(false);
  });

  it("a capture under a dream authority keeps the host-minted marker, the imposed read-only boundary and the account principal", () => {
    const scope = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope(
        { ...base, permissionBoundary: "full-access" },
        { accountId: "acct-1", dream, permissionBoundary: "read-only", tools: { allow: ["read", "shell"] } },
      ),
    );
    expect(scope.dream).toEqual(dream);
    expect(scope.accountId).toBe("acct-1");
    expect(scope.permissionBoundary).toBe("read-only");
    expect(scope.readOnly).toBe(true);
    expect(scope.tools.allow).toEqual(["read", "shell"]);
  });
});
