/**
 * Before starting the server: can this interpreter import torchls at all? Asking first turns
 * "the server exited with code 1" into a message that says what is wrong and offers the fix.
 * The parsing is pure and unit-tested; `checkInterpreter` runs the interpreter.
 */

import { execFile } from "node:child_process";

export const MINIMUM_PYTHON: readonly [number, number] = [3, 10];

/** Printed by the interpreter as `key=value` lines; the exit code says how far it got. */
export const CHECK_SCRIPT = [
    "import sys",
    'print("python=%d.%d.%d" % sys.version_info[:3])',
    `if sys.version_info[:2] < (${MINIMUM_PYTHON[0]}, ${MINIMUM_PYTHON[1]}): sys.exit(3)`,
    "try:",
    "    import torchls",
    "except Exception as error:",
    '    print("error=%s: %s" % (type(error).__name__, error))',
    "    sys.exit(4)",
    'print("torchls=%s" % getattr(torchls, "__version__", "?"))',
    'print("location=%s" % getattr(torchls, "__file__", "?"))',
].join("\n");

export type CheckResult =
    | { readonly kind: "ok"; readonly python: string; readonly torchls: string; readonly location: string }
    | { readonly kind: "notRunnable"; readonly detail: string }
    | { readonly kind: "pythonTooOld"; readonly python: string }
    | { readonly kind: "torchlsMissing"; readonly python: string; readonly detail: string };

export interface ProcessOutcome {
    /** null when the process could not be started (ENOENT, EACCES) or was killed. */
    readonly exitCode: number | null;
    readonly stdout: string;
    readonly stderr: string;
    readonly spawnError?: string;
}

export function parseCheckOutput(outcome: ProcessOutcome): CheckResult {
    const fields = new Map<string, string>();
    for (const line of outcome.stdout.split(/\r?\n/)) {
        const equals = line.indexOf("=");
        if (equals > 0) {
            fields.set(line.slice(0, equals).trim(), line.slice(equals + 1).trim());
        }
    }
    const python = fields.get("python");
    if (outcome.spawnError !== undefined || python === undefined) {
        const detail = outcome.spawnError ?? (outcome.stderr.trim() || `exit code ${outcome.exitCode}`);
        return { kind: "notRunnable", detail };
    }
    if (outcome.exitCode === 3) {
        return { kind: "pythonTooOld", python };
    }
    const version = fields.get("torchls");
    if (outcome.exitCode !== 0 || version === undefined) {
        const detail = fields.get("error") ?? (outcome.stderr.trim() || `exit code ${outcome.exitCode}`);
        return { kind: "torchlsMissing", python, detail };
    }
    return { kind: "ok", python, torchls: version, location: fields.get("location") ?? "?" };
}

export interface CheckOptions {
    readonly cwd: string;
    readonly env: NodeJS.ProcessEnv;
    readonly timeoutMs?: number;
}

export function checkInterpreter(command: string, args: readonly string[], options: CheckOptions): Promise<CheckResult> {
    return new Promise((resolve) => {
        execFile(
            command,
            [...args, "-c", CHECK_SCRIPT],
            { cwd: options.cwd, env: options.env, timeout: options.timeoutMs ?? 20_000, windowsHide: true },
            (error, stdout, stderr) => {
                const errno = error as NodeJS.ErrnoException | null;
                // A string `code` (ENOENT, EACCES) means it never ran; a number is its exit code.
                const spawnError = errno && typeof errno.code === "string" ? `${errno.code}: ${errno.message}` : undefined;
                const exitCode = errno ? (typeof errno.code === "number" ? errno.code : null) : 0;
                resolve(parseCheckOutput({ exitCode, stdout: String(stdout), stderr: String(stderr), spawnError }));
            },
        );
    });
}
