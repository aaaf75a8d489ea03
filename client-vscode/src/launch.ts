/**
 * How the server process is started: command line, environment and working directory. Pure.
 *
 * The working directory is the extension's own folder, never the workspace: `python -m` puts the
 * working directory first on sys.path, so a `torchls/` folder in an untrusted workspace would
 * otherwise be imported, that is, run, just by opening the folder.
 */

import * as path from "node:path";

export interface LaunchPlan {
    readonly command: string;
    readonly args: readonly string[];
    readonly cwd: string;
    readonly env: NodeJS.ProcessEnv;
}

/**
 * The environment for the interpreter. With `bundledLibs` (importStrategy useBundled) the
 * extension's copy of torchls and its libraries comes first on sys.path (through PYTHONPATH,
 * ahead of site-packages), as Microsoft's python-tools template does with its `bundled/libs`.
 */
export function serverEnvironment(
    base: NodeJS.ProcessEnv,
    bundledLibs: string | undefined,
    pathDelimiter: string = path.delimiter,
): NodeJS.ProcessEnv {
    const env: NodeJS.ProcessEnv = { ...base, PYTHONUNBUFFERED: "1" };
    if (bundledLibs) {
        env.PYTHONPATH = base.PYTHONPATH ? `${bundledLibs}${pathDelimiter}${base.PYTHONPATH}` : bundledLibs;
    }
    return env;
}

export function launchPlan(
    interpreter: { readonly command: string; readonly args: readonly string[] },
    bundledLibs: string | undefined,
    extensionPath: string,
    baseEnv: NodeJS.ProcessEnv,
): LaunchPlan {
    return {
        command: interpreter.command,
        // TransportKind.stdio appends `--stdio`, which `torchls server` accepts.
        args: [...interpreter.args, "-m", "torchls", "server"],
        cwd: extensionPath,
        env: serverEnvironment(baseEnv, bundledLibs),
    };
}
