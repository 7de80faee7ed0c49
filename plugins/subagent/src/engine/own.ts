/**
 * A record's own entry: keys come from definitions (node ids, agent types), and a plain `record[key]` of
 * `constructor` or `toString` would answer an Object.prototype member instead of "absent".
 */
export function ownEntry<T>(record: Readonly<Record<string, T>>, key: string): T | undefined {
  return Object.hasOwn(record, key) ? record[key] : undefined;
}
