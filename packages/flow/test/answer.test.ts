import type { HostTurn } from "@crw/flow";
import { answerText, parseAnswer, validateAgainst } from "@crw/flow";
import fc from "fast-check";
import { describe, expect, it } from "vitest";

const turn = (messages: Array<[string, "commentary" | "final_answer" | null]>): HostTurn => ({
  id: "t",
  status: "completed",
  error: null,
  items: messages.map(([text, phase], i) => ({ type: "agentMessage", id: `m${i}`, text, phase })),
});

describe("answer extraction", () => {
  it("the answer is the turn's last final_answer message (S000-084)", () => {
    expect(
      answerText(
        turn([
          ["a", "final_answer"],
          ["b", "commentary"],
          ["c", "final_answer"],
        ]),
      ),
    ).toBe("c");
    // a message after the final answer (commentary, or one with no phase) does not displace it
    expect(
      answerText(
        turn([
          ["a", "final_answer"],
          ["b", "commentary"],
        ]),
      ),
    ).toBe("a");
    expect(
      answerText(
        turn([
          ["a", "final_answer"],
          ["b", null],
        ]),
      ),
    ).toBe("a");
  });

  it("with no phase, the last message without one when no commentary came before it (S000-085)", () => {
    expect(
      answerText(
        turn([
          ["a", null],
          ["b", null],
        ]),
      ),
    ).toBe("b");
    // the last message without a phase, though commentary came after it
    expect(
      answerText(
        turn([
          ["a", null],
          ["b", "commentary"],
        ]),
      ),
    ).toBe("a");
    expect(
      answerText(
        turn([
          ["thinking", "commentary"],
          ["b", null],
        ]),
      ),
    ).toBeNull();
  });

  it("a commentary message is never the answer (S000-086)", () => {
    expect(answerText(turn([["{}", "commentary"]]))).toBeNull();
  });

  it("prose before the JSON: the object that ends the message is extracted (S000-087)", () => {
    expect(parseAnswer('{"a":1}')).toEqual({ ok: true, value: { a: 1 }, extracted: false });
    expect(parseAnswer('Done. Result:\n{"a":{"b":[1,2]}}')).toEqual({
      ok: true,
      value: { a: { b: [1, 2] } },
      extracted: true,
    });
  });

  it("refuses several objects, no object, arrays and huge answers with a reason", () => {
    expect(parseAnswer('{"a":1}\n{"b":2}')).toMatchObject({
      ok: false,
      error: expect.stringContaining("several"),
    });
    expect(parseAnswer("no json here")).toMatchObject({ ok: false });
    expect(parseAnswer("[1,2]")).toMatchObject({ ok: false });
    expect(parseAnswer(`{"a":"${"x".repeat(300_000)}"}`)).toMatchObject({
      ok: false,
      error: expect.stringContaining("larger"),
    });
  });

  it("property: any object, with any prose before it that holds no braces, comes back equal", () => {
    fc.assert(
      fc.property(
        fc.dictionary(fc.string({ maxLength: 8 }), fc.jsonValue({ maxDepth: 3 })),
        fc.string({ maxLength: 60 }).filter((s) => !s.includes("{") && !s.includes("}")),
        (obj, prose) => {
          const r = parseAnswer(`${prose}${prose ? "\n" : ""}${JSON.stringify(obj)}`);
          expect(r.ok).toBe(true);
          if (r.ok) expect(r.value).toEqual(JSON.parse(JSON.stringify(obj)));
        },
      ),
    );
  });

  it("property: parseAnswer never throws on any text", () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 300 }), (s) => {
        const r = parseAnswer(s);
        expect(typeof r.ok).toBe("boolean");
      }),
    );
  });

  it("validates against a JSON Schema and names the paths that fail", () => {
    const schema = { type: "object", required: ["n"], properties: { n: { type: "integer" } } };
    expect(validateAgainst(schema, { n: 1 })).toEqual([]);
    expect(validateAgainst(schema, { n: "x" })[0]).toMatch(/^n: /);
    expect(validateAgainst(null, 5)).toEqual([]);
  });
});
