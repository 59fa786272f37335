// TypeScript types from the generated JSON Schemas, with json-schema-to-typescript as a runtime author
// would call it: one module per schema file, default options.
//
//   node generate_types.mjs SCHEMA_DIR OUT_DIR     (writes OUT_DIR/<Message>.ts)
import fs from "node:fs";
import path from "node:path";

import { compile } from "json-schema-to-typescript";

const [dir, out] = process.argv.slice(2);
if (!dir || !out) {
  console.error("usage: node generate_types.mjs SCHEMA_DIR OUT_DIR");
  process.exit(2);
}
fs.mkdirSync(out, { recursive: true });
for (const file of fs.readdirSync(dir).filter((f) => f.endsWith(".schema.json")).sort()) {
  const schema = JSON.parse(fs.readFileSync(path.join(dir, file), "utf8"));
  const source = await compile(schema, schema.title, { bannerComment: "", cwd: dir });
  fs.writeFileSync(path.join(out, `${schema.title}.ts`), source);
}
