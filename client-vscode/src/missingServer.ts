/**
 * When the server cannot start: say exactly what is wrong and offer the fixes as buttons, so
 * that nobody needs a terminal. The fixes are: pick another interpreter, install torchls into
 * this one, or run the copy of torchls bundled inside the extension.
 */

import { spawn } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import * as vscode from "vscode";
import type { ResolvedInterpreter } from "./interpreter";
import {
    actionsFor,
    INSTALL,
    messageFor,
    SELECT,
    SHOW_LOG,
    type StartProblem,
    USE_BUNDLED,
    USE_ENVIRONMENT,
} from "./problems";
import { isPythonExtensionInstalled } from "./pythonExtension";
import type { ExtensionSettings } from "./settings";

export type { StartProblem } from "./problems";

export interface FixContext {
    readonly log: vscode.LogOutputChannel;
    readonly settings: ExtensionSettings;
    readonly bundledAvailable: boolean;
    readonly extensionPath: string;
    readonly restart: (reason: string) => Promise<void>;
}

/**
 * Where to write a setting so that it takes effect: the workspace when it already sets one
 * there (and is trusted, or the value would be ignored), else the user's settings.
 */
function targetFor(key: string): vscode.ConfigurationTarget {
    const inspected = vscode.workspace.getConfiguration().inspect(key);
    const setInWorkspace = inspected?.workspaceValue !== undefined;
    return setInWorkspace && vscode.workspace.isTrusted ? vscode.ConfigurationTarget.Workspace : vscode.ConfigurationTarget.Global;
}

async function selectInterpreter(problem: StartProblem): Promise<void> {
    const fromSetting = "interpreter" in problem && problem.interpreter.source === "setting";
    if (!fromSetting && isPythonExtensionInstalled()) {
        // The Python extension's picker; its change event restarts torchls.
        await vscode.commands.executeCommand("python.setInterpreter");
        return;
    }
    const picked = await vscode.window.showOpenDialog({
        title: "Select the Python interpreter that runs torchls",
        canSelectMany: false,
        canSelectFolders: false,
        openLabel: "Use this interpreter",
    });
    if (picked?.[0]) {
        // Writing the setting restarts the server through the configuration listener.
        await vscode.workspace
            .getConfiguration()
            .update("torchls.interpreter", [picked[0].fsPath], targetFor("torchls.interpreter"));
    }
}

/** The torchls wheel shipped in the .vsix, so that the installed server matches the extension. */
function bundledWheel(extensionPath: string): string | undefined {
    const folder = path.join(extensionPath, "bundled", "wheels");
    const wheel = fs.existsSync(folder) ? fs.readdirSync(folder).find((name) => /^torchls-.*\.whl$/.test(name)) : undefined;
    return wheel ? path.join(folder, wheel) : undefined;
}

async function install(interpreter: ResolvedInterpreter, context: FixContext): Promise<void> {
    const requirement = bundledWheel(context.extensionPath) ?? "torchls";
    const args = [...interpreter.args, "-m", "pip", "install", "--disable-pip-version-check", requirement];
    context.log.info(`installing: ${interpreter.command} ${args.join(" ")}`);
    const exitCode = await vscode.window.withProgress(
        { location: vscode.ProgressLocation.Notification, title: `torchls: installing into ${interpreter.command}` },
        () =>
            new Promise<number | null>((resolve) => {
                // cwd is the extension folder so pip never picks up a project from the workspace.
                const child = spawn(interpreter.command, args, { cwd: context.extensionPath, windowsHide: true });
                child.stdout.on("data", (chunk: Buffer) => context.log.info(chunk.toString().trimEnd()));
                child.stderr.on("data", (chunk: Buffer) => context.log.warn(chunk.toString().trimEnd()));
                child.on("error", (error) => {
                    context.log.error(String(error));
                    resolve(null);
                });
                child.on("close", (code) => resolve(code));
            }),
    );
    if (exitCode === 0) {
        void vscode.window.showInformationMessage(`torchls: installed into ${interpreter.command}.`);
        await context.restart("torchls was installed");
        return;
    }
    const choice = await vscode.window.showErrorMessage(
        `torchls: pip could not install torchls into ${interpreter.command} (exit code ${exitCode}).`,
        SHOW_LOG,
    );
    if (choice === SHOW_LOG) {
        context.log.show();
    }
}

export async function offerFixes(problem: StartProblem, context: FixContext): Promise<void> {
    const choice = await vscode.window.showErrorMessage(
        messageFor(problem),
        ...actionsFor(problem, context.settings, context.bundledAvailable),
    );
    switch (choice) {
        case SELECT:
            await selectInterpreter(problem);
            break;
        case INSTALL:
            if ("interpreter" in problem) {
                await install(problem.interpreter, context);
            }
            break;
        case USE_BUNDLED:
            await vscode.workspace.getConfiguration().update("torchls.importStrategy", "useBundled", targetFor("torchls.importStrategy"));
            break;
        case USE_ENVIRONMENT:
            await vscode.workspace
                .getConfiguration()
                .update("torchls.importStrategy", "fromEnvironment", targetFor("torchls.importStrategy"));
            break;
        case SHOW_LOG:
            context.log.show();
            break;
        default:
            break;
    }
}
