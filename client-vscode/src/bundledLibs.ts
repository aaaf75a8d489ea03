/**
 * The bundled copy of torchls and its libraries ships as bundled/libs.zip (one file keeps the
 * .vsix small and fast to package) and is unpacked on first use into the extension's global
 * storage, one folder per extension version. Unpacking uses the Python interpreter that will run
 * the server, so the extension needs no zip library. Pure of `vscode`, for tests.
 */

import { execFile } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";

const PREFIX = "bundled-libs-";

export function bundledZipPath(extensionPath: string): string {
    return path.join(extensionPath, "bundled", "libs.zip");
}

export function hasBundledLibs(extensionPath: string): boolean {
    return fs.existsSync(bundledZipPath(extensionPath));
}

function extract(python: readonly string[], zip: string, target: string): Promise<void> {
    const script = "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])";
    const [command, ...args] = python;
    return new Promise((resolve, reject) => {
        execFile(command, [...args, "-c", script, zip, target], { timeout: 120_000, windowsHide: true }, (error, _stdout, stderr) =>
            error ? reject(new Error(`unpacking ${zip} failed: ${String(stderr).trim() || error.message}`)) : resolve(),
        );
    });
}

/**
 * The folder to put on PYTHONPATH, unpacked if needed. Safe against two windows doing this at
 * once: each unpacks into its own temporary folder, and the first rename wins.
 */
export async function ensureBundledLibs(options: {
    readonly python: readonly string[];
    readonly zip: string;
    readonly storageDir: string;
    readonly version: string;
}): Promise<string> {
    const target = path.join(options.storageDir, `${PREFIX}${options.version}`);
    if (fs.existsSync(target)) {
        return target;
    }
    fs.mkdirSync(options.storageDir, { recursive: true });
    const partial = fs.mkdtempSync(path.join(options.storageDir, ".unpacking-"));
    try {
        await extract(options.python, options.zip, partial);
        try {
            fs.renameSync(partial, target);
        } catch (error) {
            if (!fs.existsSync(target)) {
                throw error;
            }
            // Another window finished first; its copy is identical.
        }
    } finally {
        fs.rmSync(partial, { recursive: true, force: true });
    }
    removeOtherVersions(options.storageDir, target);
    return target;
}

/** Copies left by earlier versions of the extension are dead weight. */
function removeOtherVersions(storageDir: string, keep: string): void {
    for (const name of fs.readdirSync(storageDir)) {
        const full = path.join(storageDir, name);
        if (name.startsWith(PREFIX) && full !== keep) {
            fs.rmSync(full, { recursive: true, force: true });
        }
    }
}
