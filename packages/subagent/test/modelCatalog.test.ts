import { ModelCatalog, type ModelCatalogPublication } from "@crw/subagent";
import { afterEach, describe, expect, it } from "vitest";
import { startHost } from "./support/runners.js";

const m = (id: string) => ({ id, provider: "scripted" });
const v1: ModelCatalogPublication = {
  revision: 1,
  public: [m("pub-a")],
  accounts: { alice: [m("alice-a")], bob: [m("bob-a")] },
};
const v2: ModelCatalogPublication = {
  revision: 2,
  public: [m("pub-b")],
  accounts: { alice: [m("alice-b")], bob: [] },
};

describe("ModelCatalog (runner publication fence)", () => {
  it("a modelsChanged publication restores the public runtime and every prepared account runtime", () => {
    const catalog = new ModelCatalog(v1);
    expect(catalog.forAccount("alice")).toEqual([m("alice-a")]);
    expect(catalog.forAccount("bob")).toEqual([m("bob-a")]);
    expect(catalog.publish(v2)).toBe(true);
    expect(catalog.publicModels).toEqual([m("pub-b")]);
    expect(catalog.forAccount("alice")).toEqual([m("alice-b")]);
    expect(catalog.forAccount("bob")).toEqual([]);
    expect(catalog.preparedAccounts.sort()).toEqual(["alice", "bob"]);
  });

  it("a catalog prepared for one account follows later publications; an account first seen after one gets that view", () => {
    const catalog = new ModelCatalog(v1);
    catalog.forAccount("alice");
    catalog.publish(v2);
    // bob was never prepared before v2: he gets v2's view, never alice's or the public one.
    expect(catalog.forAccount("bob")).toEqual([]);
    expect(catalog.forAccount("carol")).toEqual([]);
    expect(catalog.forAccount(undefined)).toEqual([m("pub-b")]);
    // Older or duplicate publications never rewind.
    expect(catalog.publish(v1)).toBe(false);
    expect(catalog.forAccount("alice")).toEqual([m("alice-b")]);
    expect(Object.isFrozen(catalog.forAccount("alice"))).toBe(true);
  });
});

describe("modelsChanged over IPC", () => {
  const stops: (() => Promise<void>)[] = [];
  afterEach(async () => {
    await Promise.all(stops.splice(0).map((s) => s()));
  });

  it("a runner acknowledges a catalog publication and keeps serving turns", async () => {
    const { host } = await startHost();
    stops.push(() => host.shutdown(1_000));
    await host.publishCatalog(v2);
    expect(
      (await host.runTurn({ turnId: "t", channelId: "c", sessionId: "s", accountId: "alice", prompt: "p" }))
        .stopReason,
    ).toBe("end");
  });
});
