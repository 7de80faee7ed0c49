// Module hooks (see npm-free-boot.mjs): any import that resolves into node_modules fails, and so does loading
// a module that carries zod (the runner's build bundles its own copy), so a runner preloaded with them can
// only say hello and boot if its boot path imports no npm package and no schema library.
export async function resolve(specifier, context, nextResolve) {
  const resolved = await nextResolve(specifier, context);
  if (resolved.url.includes("/node_modules/")) {
    throw new Error(`refused by the npm-free boot hook: "${specifier}" resolves into node_modules`);
  }
  return resolved;
}

// zod's types are made by its `$constructor`; the bundled copy keeps the call and the type names.
const zodMark = '$constructor("$ZodType"';

export async function load(url, context, nextLoad) {
  const loaded = await nextLoad(url, context);
  if (loaded.source && String(loaded.source).includes(zodMark)) {
    throw new Error(`refused by the npm-free boot hook: ${url} carries zod`);
  }
  return loaded;
}
