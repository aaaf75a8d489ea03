/**
 * The VS Code side of workflows.ts: the commands, the report's webview panel, and a read-only
 * virtual document (scheme `torchls-result`) shown in the Markdown preview for the checkpoint
 * and comparison reports.
 */

import * as vscode from "vscode";
import type { ServerController } from "./controller";
import { forward, refuseInRestrictedMode } from "./repro";
import { COMPARE_REPRO, INSPECT_CHECKPOINT, SHOW_REPRO_REPORT, type WebviewSpec, type WorkflowHost, Workflows } from "./workflows";

export const RESULT_SCHEME = "torchls-result";

/** Markdown answers of the server, as read-only documents that a new answer refreshes. */
class ResultDocuments implements vscode.TextDocumentContentProvider, vscode.Disposable {
    private readonly contents = new Map<string, string>();
    private readonly changed = new vscode.EventEmitter<vscode.Uri>();
    readonly onDidChange = this.changed.event;

    set(name: string, markdown: string): vscode.Uri {
        const uri = vscode.Uri.from({ scheme: RESULT_SCHEME, path: `/${name}` });
        this.contents.set(uri.toString(), markdown);
        this.changed.fire(uri);
        return uri;
    }

    provideTextDocumentContent(uri: vscode.Uri): string {
        return this.contents.get(uri.toString()) ?? "";
    }

    dispose(): void {
        this.changed.dispose();
    }
}

/** One panel per view type, reused: a new report replaces the one shown. */
class Panels implements vscode.Disposable {
    private readonly panels = new Map<string, vscode.WebviewPanel>();

    show(spec: WebviewSpec): void {
        let panel = this.panels.get(spec.viewType);
        if (panel) {
            panel.title = spec.title;
            panel.reveal(undefined, true);
        } else {
            panel = vscode.window.createWebviewPanel(
                spec.viewType,
                spec.title,
                { viewColumn: vscode.ViewColumn.Beside, preserveFocus: true },
                {
                    enableScripts: spec.options.enableScripts,
                    enableForms: spec.options.enableForms,
                    localResourceRoots: [...spec.options.localResourceRoots],
                    enableFindWidget: true,
                },
            );
            const created = panel;
            this.panels.set(spec.viewType, created);
            created.onDidDispose(() => this.panels.delete(spec.viewType));
        }
        panel.webview.html = spec.html;
    }

    dispose(): void {
        for (const panel of this.panels.values()) {
            panel.dispose();
        }
        this.panels.clear();
    }
}

function activePythonDocument(): ReturnType<WorkflowHost["activePythonDocument"]> {
    const document = vscode.window.activeTextEditor?.document;
    if (document?.languageId !== "python") {
        return undefined;
    }
    return {
        uri: document.uri.toString(),
        name: document.uri.path.split("/").at(-1) ?? document.uri.path,
        isDirty: document.isDirty,
        save: () => Promise.resolve(document.save()),
    };
}

/** A command's first argument as a URI string: a code action passes a string (or `{uri}`), a menu a Uri. */
function uriArgument(value: unknown): string | undefined {
    if (typeof value === "string" && value) {
        return value;
    }
    if (value instanceof vscode.Uri) {
        return value.toString();
    }
    const uri: unknown = typeof value === "object" && value !== null ? (value as { uri?: unknown }).uri : undefined;
    return typeof uri === "string" && uri ? uri : undefined;
}

function pathArgument(value: unknown): string | undefined {
    if (typeof value === "string" && value) {
        return value.startsWith("file:") ? vscode.Uri.parse(value).fsPath : value;
    }
    return value instanceof vscode.Uri && value.scheme === "file" ? value.fsPath : undefined;
}

function createWorkflowHost(controller: ServerController, panels: { show(spec: WebviewSpec): void }, results: ResultDocuments): WorkflowHost {
    return {
        isTrusted: () => vscode.workspace.isTrusted,
        refuseUntrusted: refuseInRestrictedMode,
        activePythonDocument,
        serverOffers: (command) => controller.runningClient?.serverCommands.offers(command) ?? false,
        request: (command, args) => forward(controller, command, args),
        showWebview: (spec) => panels.show(spec),
        showMarkdown: async (name, markdown) => {
            const uri = results.set(name, markdown);
            try {
                await vscode.commands.executeCommand("markdown.showPreview", uri);
            } catch {
                // The built-in Markdown extension is disabled: the source is readable too.
                const document = await vscode.workspace.openTextDocument(uri);
                await vscode.window.showTextDocument(document, { preview: true, viewColumn: vscode.ViewColumn.Beside });
            }
        },
        pickFile: async (title, filters) => {
            const picked = await vscode.window.showOpenDialog({
                title,
                openLabel: "Inspect",
                canSelectFiles: true,
                canSelectFolders: false,
                canSelectMany: false,
                filters: Object.fromEntries(Object.entries(filters).map(([label, extensions]) => [label, [...extensions]])),
                defaultUri: vscode.workspace.workspaceFolders?.[0]?.uri,
            });
            return picked?.[0]?.fsPath;
        },
        info: (message, ...actions) => Promise.resolve(vscode.window.showInformationMessage(message, ...actions)),
        error: (message) => void vscode.window.showErrorMessage(message),
        runCommand: (command, ...args) => Promise.resolve(vscode.commands.executeCommand(command, ...args)),
    };
}

export function registerWorkflowCommands(controller: ServerController): { workflows: Workflows; disposables: vscode.Disposable[] } {
    const panels = new Panels();
    const results = new ResultDocuments();
    const workflows = new Workflows(createWorkflowHost(controller, panels, results));
    const disposables = [
        panels,
        results,
        vscode.workspace.registerTextDocumentContentProvider(RESULT_SCHEME, results),
        vscode.commands.registerCommand(SHOW_REPRO_REPORT, (uri?: unknown) => workflows.showReproReport(uriArgument(uri))),
        vscode.commands.registerCommand(INSPECT_CHECKPOINT, (file?: unknown) => workflows.inspectCheckpoint(pathArgument(file))),
        vscode.commands.registerCommand(COMPARE_REPRO, (uri?: unknown, baseline?: unknown) =>
            workflows.compareWithHead(uriArgument(uri), typeof baseline === "string" && baseline ? baseline : undefined),
        ),
    ];
    return { workflows, disposables };
}
