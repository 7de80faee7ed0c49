import fc from "fast-check";

/**
 * Generated values for the tests that hold a hand-written frame check to its schema: mostly valid values,
 * now and then one at or past an edge the schema draws, or one of another kind altogether.
 */

/** Mostly the valid arbitrary, sometimes one of the edge values. */
export const mostly = <T>(ok: fc.Arbitrary<T>, edges: fc.Arbitrary<unknown>) =>
  fc.oneof({ arbitrary: ok, weight: 30 }, { arbitrary: edges, weight: 1 });

export const strangeValue = fc.oneof(
  fc.constantFrom(undefined, null, true, "", "1", 1, -0, Number.NaN, Number.POSITIVE_INFINITY, [], {}),
  fc.anything({ maxDepth: 1 }),
);

/** Strings near [min, max] code points: astral characters, lone and paired surrogates included. */
export function stringsNear(min: number, max: number): fc.Arbitrary<string> {
  const unit = fc.constantFrom("a", "é", "😀", "\ud800", "\udc00", " ", "\t");
  const lengths = fc.constantFrom(...[min - 1, min, min + 1, max - 1, max, max + 1].filter((n) => n >= 0));
  return fc.oneof(
    { arbitrary: fc.string({ unit, minLength: min, maxLength: Math.min(max, 24) }), weight: 30 },
    { arbitrary: lengths.chain((n) => fc.string({ unit, minLength: n, maxLength: n })), weight: 1 },
  );
}

export const textNear = (min: number, max: number) => mostly(stringsNear(min, max), strangeValue);

export function intNear(min: number, max = Number.MAX_SAFE_INTEGER) {
  return mostly(
    fc.integer({ min, max: Math.min(max, 2 ** 31) }),
    fc.oneof(fc.constantFrom(min - 1, min, max, max + 1, min + 0.5, 2 ** 53), strangeValue),
  );
}

/** A record's keys: ordinary ones, an empty one, overlong ones, and the key that would replace a prototype. */
export function recordOf<T>(key: fc.Arbitrary<string>, value: fc.Arbitrary<T>) {
  const keys = fc.oneof(
    { arbitrary: key, weight: 30 },
    { arbitrary: fc.constantFrom("__proto__", ""), weight: 1 },
  );
  return fc.dictionary(keys, value, { maxKeys: 3 });
}
