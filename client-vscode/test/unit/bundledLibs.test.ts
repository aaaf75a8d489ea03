import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { ensureBundledLibs } from "../../src/bundledLibs";

// Any Python 3 does: unpacking only needs zipfile.
const python = process.env.TORCHLS_VENV ? path.join(process.env.TORCHLS_VENV, "bin", "python") : "python3";
const scratch: string[] = [];

function tempDir(): string {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "torchls-unit-"));
    scratch.push(dir);
    return dir;
}

function makeZip(): string {
    const source = tempDir();
    fs.mkdirSync(path.join(source, "torchls"));
    fs.writeFileSync(path.join(source, "torchls", "__init__.py"), "__version__ = 'bundled'\n");
    const base = path.join(tempDir(), "libs");
    execFileSync(python, ["-c", "import shutil, sys; shutil.make_archive(sys.argv[1], 'zip', sys.argv[2])", base, source]);
    return `${base}.zip`;
}

afterEach(() => {
    for (const dir of scratch.splice(0)) {
        fs.rmSync(dir, { recursive: true, force: true });
    }
});

describe("ensureBundledLibs", () => {
    it("unpacks once per version and removes other versions' copies", async () => {
        const zip = makeZip();
        const storageDir = tempDir();
        fs.mkdirSync(path.join(storageDir, "bundled-libs-0.0.1"));

        const libs = await ensureBundledLibs({ python: [python], zip, storageDir, version: "0.1.0" });
        expect(libs).toBe(path.join(storageDir, "bundled-libs-0.1.0"));
        expect(fs.readFileSync(path.join(libs, "torchls", "__init__.py"), "utf8")).toContain("bundled");
        expect(fs.readdirSync(storageDir)).toEqual(["bundled-libs-0.1.0"]);

        // The second call reuses the folder (a marker written inside survives).
        fs.writeFileSync(path.join(libs, "marker"), "");
        expect(await ensureBundledLibs({ python: [python], zip, storageDir, version: "0.1.0" })).toBe(libs);
        expect(fs.existsSync(path.join(libs, "marker"))).toBe(true);
    });

    it("reports a zip it cannot unpack and leaves nothing half-done", async () => {
        const storageDir = tempDir();
        const broken = path.join(tempDir(), "libs.zip");
        fs.writeFileSync(broken, "not a zip");
        await expect(ensureBundledLibs({ python: [python], zip: broken, storageDir, version: "0.1.0" })).rejects.toThrow(/unpacking/);
        expect(fs.readdirSync(storageDir)).toEqual([]);
    });
});
