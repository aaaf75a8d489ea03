// Fills bundled/ for the .vsix: a torchls wheel built from this repository (what "Install
// torchls" installs, so the server always matches the extension) and bundled/libs.zip, the same
// torchls plus its dependencies, for `torchls.importStrategy: useBundled`.
//
// One zip rather than a folder: jedi alone is ~5,700 files (its typeshed stubs), and vsce's
// secret scan takes minutes over that many; the extension unpacks the zip on first use
// (src/bundledLibs.ts).
//
// Python: $TORCHLS_BUNDLE_PYTHON, else python3. Needs pip and a package index (PyPI or a mirror).
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

const clientDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const repoRoot = path.resolve(clientDir, "..");
const bundled = path.join(clientDir, "bundled");
const wheels = path.join(bundled, "wheels");
const libsZip = path.join(bundled, "libs.zip");
const python = process.env.TORCHLS_BUNDLE_PYTHON || "python3";
// CI runs as root; pip's warning about that is noise here, the target is our own folder.
const pip = ["-m", "pip", "--disable-pip-version-check", "--quiet"];
const rootOk = ["--root-user-action=ignore"];

/**
 * Dependencies without a pure wheel whose Python half works alone: PyYAML falls back to its pure
 * implementation when the compiled `_yaml` module is absent, so we ship `yaml/` without it.
 */
const PURE_PARTS_OF = { pyyaml: { requirement: "pyyaml==6.0.4", packages: ["yaml"] } };

function run(args) {
    execFileSync(python, args, { cwd: clientDir, stdio: ["ignore", "inherit", "inherit"] });
}

const normalise = (name) => name.toLowerCase().replace(/[-_.]+/g, "-");

/** Names in `dependencies = [...]` of pyproject.toml (enough TOML for that one array). */
function projectDependencies() {
    const text = fs.readFileSync(path.join(repoRoot, "pyproject.toml"), "utf8");
    const block = /^dependencies\s*=\s*\[([\s\S]*?)^\]/m.exec(text)?.[1] ?? "";
    return [...block.matchAll(/"([A-Za-z0-9_.-]+)/g)].map((match) => normalise(match[1]));
}

function checkEveryDependencyBundled() {
    const pinned = fs
        .readFileSync(path.join(clientDir, "bundled-requirements.txt"), "utf8")
        .split("\n")
        .map((line) => line.replace(/#.*/, "").trim())
        .filter(Boolean)
        .map((line) => normalise(line.split("==")[0]));
    const covered = new Set([...pinned, ...Object.keys(PURE_PARTS_OF)]);
    const missing = projectDependencies().filter((name) => !covered.has(name));
    if (missing.length > 0) {
        throw new Error(`bundle-libs: pyproject.toml depends on ${missing.join(", ")}, which bundled-requirements.txt does not pin`);
    }
}

function buildWheel(staging) {
    // Build from a copy so that setuptools' build/ and *.egg-info never land in the repository.
    for (const entry of ["pyproject.toml", "README.md", "server"]) {
        fs.cpSync(path.join(repoRoot, entry), path.join(staging, entry), {
            recursive: true,
            filter: (source) => !/(__pycache__|\.egg-info)$/.test(source),
        });
    }
    run([...pip, "wheel", "--no-deps", "--wheel-dir", wheels, staging]);
    const wheel = fs.readdirSync(wheels).find((name) => name.startsWith("torchls-") && name.endsWith(".whl"));
    if (!wheel) {
        throw new Error("bundle-libs: pip did not produce a torchls wheel");
    }
    return path.join(wheels, wheel);
}

function installPure(wheel, libs) {
    // Pure wheels only and no .pyc: the user's Python may be any version from 3.10 on.
    run([
        ...pip, "install", ...rootOk,
        "--target", libs,
        "--no-deps", "--no-compile", "--only-binary=:all:",
        "--implementation", "py", "--python-version", "3.10", "--platform", "any",
        "--requirement", path.join(clientDir, "bundled-requirements.txt"),
        wheel,
    ]);
}

function installPureParts(staging, libs) {
    for (const { requirement, packages } of Object.values(PURE_PARTS_OF)) {
        const target = path.join(staging, "platform");
        run([...pip, "install", ...rootOk, "--target", target, "--no-deps", "--no-compile", requirement]);
        // The dist-info folder goes along for the licence text.
        const distInfo = fs.readdirSync(target).filter((name) => name.endsWith(".dist-info"));
        for (const name of [...packages, ...distInfo]) {
            fs.cpSync(path.join(target, name), path.join(libs, name), {
                recursive: true,
                filter: (source) => !/\.(so|pyd|dylib)$|__pycache__$/.test(source),
            });
        }
    }
}

if (!fs.existsSync(path.join(repoRoot, "server", "torchls", "__init__.py"))) {
    throw new Error(`bundle-libs: expected the torchls sources in ${repoRoot}/server`);
}
checkEveryDependencyBundled();
fs.rmSync(bundled, { recursive: true, force: true });
fs.mkdirSync(wheels, { recursive: true });
const staging = fs.mkdtempSync(path.join(os.tmpdir(), "torchls-bundle-"));
try {
    const wheel = buildWheel(path.join(staging, "source"));
    const libs = path.join(staging, "libs");
    installPure(wheel, libs);
    installPureParts(staging, libs);
    fs.rmSync(path.join(libs, "bin"), { recursive: true, force: true });
    run(["-c", "import shutil, sys; shutil.make_archive(sys.argv[1], 'zip', sys.argv[2])", libsZip.replace(/\.zip$/, ""), libs]);
    const size = (fs.statSync(libsZip).size / 1e6).toFixed(1);
    console.log(`bundle-libs: ${path.basename(wheel)}; bundled/libs.zip (${fs.readdirSync(libs).length} entries, ${size} MB)`);
} finally {
    fs.rmSync(staging, { recursive: true, force: true });
}
