// Module resolve hook (see npm-free-boot.mjs): any import that resolves into node_modules fails, so a runner
// preloaded with it can only say hello and boot if its boot path imports no npm package (zod above all).
export async function resolve(specifier, context, nextResolve) {
  const resolved = await nextResolve(specifier, context);
  if (resolved.url.includes("/node_modules/")) {
    throw new Error(`refused by the npm-free boot hook: "${specifier}" resolves into node_modules`);
  }
  return resolved;
}
