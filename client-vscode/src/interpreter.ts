/**
 * Which Python runs the torchls server: the pure part of the decision, kept free of the
 * `vscode` module so that unit tests can drive it with plain values.
 *
 * Order: the `torchls.interpreter` setting; the Python extension's active environment when that
 * extension is installed; `python3` (then `python`) on PATH. The first source that gives an
 * answer wins, even if torchls later turns out not to be importable there: silently skipping to
 * another interpreter would hide the user's choice.
 */

import * as path from "node:path";

export type InterpreterSource = "setting" | "pythonExtension" | "path";

export interface ResolvedInterpreter {
    /** The executable. */
    readonly command: string;
    /** Arguments that belong to the interpreter itself (e.g. `["-X", "utf8"]`), before `-m`. */
    readonly args: readonly string[];
    readonly source: InterpreterSource;
}

export interface InterpreterInputs {
    /** `torchls.interpreter`: the executable and its own arguments; empty means "not set". */
    readonly setting: readonly string[];
    /** The folder `${workspaceFolder}` and relative paths refer to, if any. */
    readonly workspaceFolder?: string;
    readonly userHome: string;
    readonly env: Readonly<Record<string, string | undefined>>;
    readonly platform: NodeJS.Platform;
    /** The Python extension's active interpreter; undefined when it is absent or has none. */
    readonly pythonExtension?: () => Promise<readonly string[] | undefined>;
    readonly isExecutable: (file: string) => boolean;
}

/** `${workspaceFolder}`, `${userHome}`, `${env:NAME}` and a leading `~`, as VS Code users write them. */
export function expandVariables(
    value: string,
    context: Pick<InterpreterInputs, "workspaceFolder" | "userHome" | "env">,
): string {
    let expanded = value.replace(/\$\{(workspaceFolder|userHome|env:([A-Za-z_][A-Za-z0-9_]*))\}/g, (match, name: string, envName?: string) => {
        if (name === "userHome") {
            return context.userHome;
        }
        if (name === "workspaceFolder") {
            // Leave it in place when there is no folder, so the error names what was missing.
            return context.workspaceFolder ?? match;
        }
        return context.env[envName ?? ""] ?? "";
    });
    if (expanded === "~" || expanded.startsWith("~/") || expanded.startsWith("~\\")) {
        expanded = context.userHome + expanded.slice(1);
    }
    return expanded;
}

/** The interpreter named by the setting, with variables expanded and relative paths anchored. */
export function interpreterFromSetting(
    setting: readonly string[],
    context: Pick<InterpreterInputs, "workspaceFolder" | "userHome" | "env">,
): { command: string; args: string[] } | undefined {
    const parts = setting.map((part) => expandVariables(part, context).trim()).filter((part) => part.length > 0);
    if (parts.length === 0) {
        return undefined;
    }
    let [command] = parts;
    // "./.venv/bin/python" means the workspace's venv, not one relative to VS Code's own cwd.
    // A bare name such as "python3.12" is left for the OS to find on PATH.
    const looksRelativePath = !path.isAbsolute(command) && /[\\/]/.test(command);
    if (looksRelativePath && context.workspaceFolder) {
        command = path.join(context.workspaceFolder, command);
    }
    return { command, args: parts.slice(1) };
}

/** The first `python3`/`python` on PATH (`python.exe` first on Windows). */
export function findPythonOnPath(inputs: Pick<InterpreterInputs, "env" | "platform" | "isExecutable">): string | undefined {
    const windows = inputs.platform === "win32";
    const searchPath = inputs.env.PATH ?? inputs.env.Path ?? "";
    const names = windows ? ["python.exe", "python3.exe"] : ["python3", "python"];
    const directories = searchPath.split(windows ? ";" : ":").filter((dir) => dir.length > 0);
    const join = windows ? path.win32.join : path.posix.join;
    for (const name of names) {
        for (const directory of directories) {
            const candidate = join(directory, name);
            if (inputs.isExecutable(candidate)) {
                return candidate;
            }
        }
    }
    return undefined;
}

export async function resolveInterpreter(inputs: InterpreterInputs): Promise<ResolvedInterpreter | undefined> {
    const fromSetting = interpreterFromSetting(inputs.setting, inputs);
    if (fromSetting) {
        return { ...fromSetting, source: "setting" };
    }
    if (inputs.pythonExtension) {
        let active: readonly string[] | undefined;
        try {
            active = await inputs.pythonExtension();
        } catch {
            // The Python extension failing must not stop torchls: fall through to PATH.
            active = undefined;
        }
        if (active && active.length > 0 && active[0]) {
            return { command: active[0], args: active.slice(1), source: "pythonExtension" };
        }
    }
    const onPath = findPythonOnPath(inputs);
    return onPath ? { command: onPath, args: [], source: "path" } : undefined;
}

export function describeSource(source: InterpreterSource): string {
    switch (source) {
        case "setting":
            return "the torchls.interpreter setting";
        case "pythonExtension":
            return "the Python extension's selected environment";
        case "path":
            return "PATH";
    }
}
