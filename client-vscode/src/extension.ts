/**
 * Entry point: wires the log, the status bar item, the server controller, the commands and the
 * events that restart the server.
 */

import * as vscode from "vscode";
import { ServerController } from "./controller";
import { onDidChangeActiveInterpreter } from "./pythonExtension";
import { registerReproCommands } from "./repro";
import { needsRestart } from "./settings";
import { StatusItem } from "./status";
import { registerWorkflowCommands } from "./workflowCommands";

let controller: ServerController | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
    const log = vscode.window.createOutputChannel("torchls", { log: true });
    const status = new StatusItem();
    const current = new ServerController(context, log, status);
    controller = current;
    const workflows = registerWorkflowCommands(current);

    context.subscriptions.push(
        log,
        status,
        current,
        vscode.commands.registerCommand("torchls.restart", () => current.restart("torchls.restart command")),
        vscode.commands.registerCommand("torchls.showOutput", () => log.show()),
        ...workflows.disposables,
        ...registerReproCommands(current, status, workflows.workflows),
        vscode.workspace.onDidChangeConfiguration((event) => {
            if (needsRestart((section) => event.affectsConfiguration(section))) {
                void current.restart("interpreter settings changed");
            }
            // enable/select/ignore/run/probe.* reach the running server through
            // didChangeConfiguration (the server registers for section "torchls").
        }),
        // The server learns trust only at initialize, so granting trust needs a new process.
        vscode.workspace.onDidGrantWorkspaceTrust(() => void current.restart("the workspace is now trusted")),
        vscode.workspace.onDidChangeWorkspaceFolders(() => void current.restartIfInterpreterChanged("workspace folders changed")),
    );
    // Not awaited: subscribing activates the Python extension, which torchls must not wait for.
    void onDidChangeActiveInterpreter(() => void current.restartIfInterpreterChanged("the Python environment changed")).then(
        (subscription) => context.subscriptions.push(subscription),
    );

    // Not awaited: activation must not wait for Python to start; the status item shows progress.
    void current.restart("activation");
}

export async function deactivate(): Promise<void> {
    await controller?.stop();
    controller = undefined;
}
