/**
 * Optional integration with the Python extension (ms-python.python) through its npm API. The
 * extension is not a dependency: when it is missing or fails, every function here answers
 * "nothing" and torchls falls back to PATH.
 */

import { PythonExtension } from "@vscode/python-extension";
import * as vscode from "vscode";

const PYTHON_EXTENSION_ID = "ms-python.python";

export function isPythonExtensionInstalled(): boolean {
    return vscode.extensions.getExtension(PYTHON_EXTENSION_ID) !== undefined;
}

async function api(): Promise<PythonExtension | undefined> {
    // Checked first because PythonExtension.api() throws when the extension is absent.
    if (!isPythonExtensionInstalled()) {
        return undefined;
    }
    return PythonExtension.api();
}

/** The active environment's interpreter command for `resource`, or undefined. */
export async function activeInterpreter(resource: vscode.Uri | undefined): Promise<string[] | undefined> {
    const python = await api();
    if (!python) {
        return undefined;
    }
    const environmentPath = python.environments.getActiveEnvironmentPath(resource);
    const environment = await python.environments.resolveEnvironment(environmentPath);
    const executable = environment?.executable.uri?.fsPath;
    return executable ? [executable] : undefined;
}

/** Calls `listener` when the user selects another environment; a no-op without the extension. */
export async function onDidChangeActiveInterpreter(listener: () => void): Promise<vscode.Disposable> {
    try {
        const python = await api();
        if (python) {
            return python.environments.onDidChangeActiveEnvironmentPath(() => listener());
        }
    } catch {
        // Falls through: without the Python extension's events, the setting and PATH still work.
    }
    return new vscode.Disposable(() => undefined);
}
