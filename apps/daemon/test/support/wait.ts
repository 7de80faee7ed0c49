/** Polls `check` until it holds; past `ms` it fails naming what it waited for. */
export async function waitFor(
  check: () => boolean | Promise<boolean>,
  what: string,
  ms = 30_000,
): Promise<void> {
  const until = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
