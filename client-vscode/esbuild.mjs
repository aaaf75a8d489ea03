// Bundles the extension into dist/extension.js (one file, so the .vsix needs no node_modules),
// or, with --e2e, the end-to-end test runner into out/e2e/run.js.
import * as esbuild from "esbuild";

const production = process.argv.includes("--production");
const e2e = process.argv.includes("--e2e");

const common = { bundle: true, platform: "node", target: "node20", format: "cjs", logLevel: "warning" };

if (e2e) {
    await esbuild.build({
        ...common,
        entryPoints: ["test/e2e/run.ts"],
        outfile: "out/e2e/run.js",
        // The runner executes from this folder, where node_modules has puppeteer-core.
        packages: "external",
        sourcemap: true,
    });
} else {
    await esbuild.build({
        ...common,
        entryPoints: ["src/extension.ts"],
        outfile: "dist/extension.js",
        external: ["vscode"],
        minify: production,
        sourcemap: !production,
    });
}
