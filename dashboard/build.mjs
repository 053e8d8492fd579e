// Builds the dashboard into the Python package: one script, one stylesheet, the page, and build-info.json
// holding a hash of these sources (a Python test compares it, so a stale bundle is caught without Node.js).
import { build } from "esbuild";
import { createHash } from "node:crypto";
import { copyFileSync, mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
const out = join(here, "..", "src", "nereid", "frontends", "dashboard", "static");

function walk(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? walk(path) : [path];
  });
}

// The same files, in the same order and framing, as tests/unit/test_dashboard_bundle.py hashes.
export function sourceHash() {
  const files = [...walk(join(here, "src")), ...["index.html", "package.json", "package-lock.json", "build.mjs"].map((f) => join(here, f))];
  const names = files.map((f) => relative(here, f).split("\\").join("/")).sort();
  const hash = createHash("sha256");
  for (const name of names) {
    hash.update(name + "\0");
    hash.update(readFileSync(join(here, name)));
    hash.update("\0");
  }
  return hash.digest("hex");
}

mkdirSync(out, { recursive: true });
await build({
  entryPoints: [join(here, "src", "main.js")],
  bundle: true,
  minify: true,
  format: "iife",
  target: ["es2020"],
  outfile: join(out, "dashboard.js"),
  legalComments: "eof",
  logLevel: "warning",
});
await build({
  entryPoints: [join(here, "src", "style.css")],
  bundle: true,
  minify: true,
  outfile: join(out, "dashboard.css"),
  logLevel: "warning",
});
copyFileSync(join(here, "index.html"), join(out, "index.html"));
const pkg = JSON.parse(readFileSync(join(here, "package-lock.json"), "utf8")).packages;
const versions = Object.fromEntries(["preact", "htm", "uplot", "esbuild"].map((n) => [n, pkg[`node_modules/${n}`]?.version]));
writeFileSync(join(out, "build-info.json"), JSON.stringify({ sources_sha256: sourceHash(), packages: versions }, null, 2) + "\n");
console.log(`dashboard built into ${relative(process.cwd(), out)}`);
