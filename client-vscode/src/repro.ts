/**
 * torchls.runRepro and torchls.clearRepro: forwarded to the server's `workspace/executeCommand`
 * of the same name. The extension owns these commands (rather than vscode-languageclient) so
 * that they refuse clearly when the workspace is untrusted, the server is down, or the server
 * does not offer the repro yet.
 */

import * as vscode from "vscode";
import { ExecuteCommandRequest } from "vscode-languageclient/node";
import type { ServerController } from "./controller";
import { reproArguments } from "./reproArguments";
import type { StatusItem } from "./status";
import type { Workflows } from "./workflows";

export const RUN_REPRO = "torchls.runRepro";
export const CLEAR_REPRO = "torchls.clearRepro";

/** Says why Restricted Mode disables a command that runs code, and offers to manage trust. */
export async function refuseInRestrictedMode(message: string): Promise<void> {
    const manage = "Manage Workspace Trust";
    const choice = await vscode.window.showWarningMessage(message, manage);
    if (choice === manage) {
        await vscode.commands.executeCommand("workbench.trust.manage");
    }
}

export async function forward(controller: ServerController, command: string, args: unknown[]): Promise<unknown> {
    await controller.settled();
    const client = controller.runningClient;
    if (!client) {
        const choice = await vscode.window.showErrorMessage("torchls: the server is not running.", "Show Log");
        if (choice) {
            await vscode.commands.executeCommand("torchls.showOutput");
        }
        return undefined;
    }
    if (!client.serverCommands.offers(command)) {
        void vscode.window.showInformationMessage(
            `torchls: this torchls server does not offer ${command}. Update torchls in the selected interpreter.`,
        );
        return undefined;
    }
    return client.sendRequest(ExecuteCommandRequest.type, { command, arguments: args });
}

export function registerReproCommands(controller: ServerController, status: StatusItem, workflows: Workflows): vscode.Disposable[] {
    const runRepro = vscode.commands.registerCommand(RUN_REPRO, async (...given: unknown[]) => {
        if (!vscode.workspace.isTrusted) {
            await refuseInRestrictedMode(
                "torchls: the repro runs your training code, so it is disabled in Restricted Mode. Trust this workspace to use it.",
            );
            return undefined;
        }
        const editor = vscode.window.activeTextEditor;
        const active = editor ? { uri: editor.document.uri.toString(), languageId: editor.document.languageId } : undefined;
        const args = reproArguments(given, active);
        if (!args) {
            void vscode.window.showInformationMessage("torchls: open the Python training script to run the repro on.");
            return undefined;
        }
        if (editor?.document.isDirty) {
            // The repro runs the file from disk; running stale code would mislead.
            await editor.document.save();
        }
        status.show({ kind: "busy", task: "repro" });
        try {
            const result = await forward(controller, RUN_REPRO, args);
            // Not awaited: the command answers (to a code action, say) without waiting for a click.
            void workflows.afterRepro(args, result);
            return result;
        } catch (error) {
            void vscode.window.showErrorMessage(`torchls: the repro failed: ${error instanceof Error ? error.message : String(error)}`);
            return undefined;
        } finally {
            status.idle();
        }
    });
    const clearRepro = vscode.commands.registerCommand(CLEAR_REPRO, async (...given: unknown[]) => {
        const editor = vscode.window.activeTextEditor;
        const active = editor ? { uri: editor.document.uri.toString(), languageId: editor.document.languageId } : undefined;
        // Clearing runs nothing, so it is allowed in Restricted Mode too.
        return forward(controller, CLEAR_REPRO, reproArguments(given, active) ?? []);
    });
    return [runRepro, clearRepro];
}
