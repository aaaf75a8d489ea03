/**
 * The status bar item: what the server is doing, at a glance; a click opens the log.
 */

import * as vscode from "vscode";

export type ServerState =
    | { readonly kind: "starting" }
    | { readonly kind: "running"; readonly detail: string }
    | { readonly kind: "busy"; readonly task: string }
    | { readonly kind: "stopped"; readonly reason: string }
    | { readonly kind: "error"; readonly reason: string };

export class StatusItem implements vscode.Disposable {
    private readonly item: vscode.StatusBarItem;
    private lastSteady: ServerState = { kind: "starting" };
    private trusted = true;

    constructor() {
        this.item = vscode.window.createStatusBarItem("torchls.status", vscode.StatusBarAlignment.Right, 100);
        this.item.name = "torchls";
        this.item.command = "torchls.showOutput";
        this.show({ kind: "starting" });
        this.item.show();
    }

    setTrusted(trusted: boolean): void {
        this.trusted = trusted;
        this.render(this.lastSteady);
    }

    show(state: ServerState): void {
        if (state.kind !== "busy") {
            this.lastSteady = state;
        }
        this.render(state);
    }

    /** Back to the state before a busy spell (a repro) began. */
    idle(): void {
        this.render(this.lastSteady);
    }

    private render(state: ServerState): void {
        const restricted = this.trusted ? "" : "\n\nRestricted Mode: static checks only; the repro is disabled.";
        this.item.backgroundColor = undefined;
        switch (state.kind) {
            case "starting":
                this.item.text = "$(sync~spin) torchls";
                this.item.tooltip = "torchls: starting the server";
                break;
            case "running":
                this.item.text = this.trusted ? "$(check) torchls" : "$(shield) torchls";
                this.item.tooltip = `torchls: running\n${state.detail}${restricted}`;
                break;
            case "busy":
                this.item.text = `$(sync~spin) torchls: ${state.task}`;
                this.item.tooltip = `torchls: ${state.task}`;
                break;
            case "stopped":
                this.item.text = "$(circle-slash) torchls";
                this.item.tooltip = `torchls: stopped (${state.reason})`;
                break;
            case "error":
                this.item.text = "$(error) torchls";
                this.item.tooltip = `torchls: ${state.reason}\nClick to see the log.`;
                this.item.backgroundColor = new vscode.ThemeColor("statusBarItem.errorBackground");
                break;
        }
    }

    dispose(): void {
        this.item.dispose();
    }
}
