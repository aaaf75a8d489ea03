/**
 * Owns the server's lifecycle: resolve the interpreter, check that it can import torchls, start
 * the client, and restart when something that shapes the process changes. Restarts are
 * serialised and coalesced, because a single settings edit can fire several events.
 */

import * as fs from "node:fs";
import * as os from "node:os";
import * as vscode from "vscode";
import { State } from "vscode-languageclient/node";
import { createClient, type TorchlsClient } from "./client";
import { bundledZipPath, ensureBundledLibs, hasBundledLibs } from "./bundledLibs";
import { describeSource, expandVariables, type ResolvedInterpreter, resolveInterpreter } from "./interpreter";
import { launchPlan } from "./launch";
import { type FixContext, offerFixes } from "./missingServer";
import { activeInterpreter, isPythonExtensionInstalled } from "./pythonExtension";
import { checkInterpreter } from "./serverCheck";
import { type ExtensionSettings, initializationOptions, readSettings, SERVER_SECTION, type ServerSettings, serverSettings } from "./settings";
import type { StatusItem } from "./status";

function isExecutable(file: string): boolean {
    try {
        fs.accessSync(file, fs.constants.X_OK);
        return fs.statSync(file).isFile();
    } catch {
        return false;
    }
}

/** The folder whose settings and interpreter the (single, window-wide) server uses. */
function primaryFolder(): vscode.WorkspaceFolder | undefined {
    const active = vscode.window.activeTextEditor?.document.uri;
    return (active && vscode.workspace.getWorkspaceFolder(active)) ?? vscode.workspace.workspaceFolders?.[0];
}

function readSettingsFor(scope: vscode.Uri | undefined): ExtensionSettings {
    const configuration = vscode.workspace.getConfiguration(SERVER_SECTION, scope);
    return readSettings({ get: (key) => configuration.get(key) });
}

function sameInterpreter(a: ResolvedInterpreter | undefined, b: ResolvedInterpreter | undefined): boolean {
    return a?.command === b?.command && JSON.stringify(a?.args) === JSON.stringify(b?.args);
}

export class ServerController implements vscode.Disposable {
    private client: TorchlsClient | undefined;
    private interpreter: ResolvedInterpreter | undefined;
    private queue: Promise<void> = Promise.resolve();
    private restartPending = false;
    private disposed = false;

    constructor(
        private readonly context: vscode.ExtensionContext,
        private readonly log: vscode.LogOutputChannel,
        private readonly status: StatusItem,
    ) {}

    /** The running client, or undefined while stopped, starting or failed. */
    get runningClient(): TorchlsClient | undefined {
        return this.client?.isRunning() ? this.client : undefined;
    }

    /** Resolves once no start or restart is in progress (a command run during start-up waits). */
    settled(): Promise<void> {
        return this.queue;
    }

    get bundledAvailable(): boolean {
        return hasBundledLibs(this.context.extensionPath);
    }

    restart(reason: string): Promise<void> {
        if (this.restartPending) {
            return this.queue; // the queued restart will read the newest settings anyway
        }
        this.restartPending = true;
        this.queue = this.queue.then(async () => {
            this.restartPending = false;
            if (this.disposed) {
                return;
            }
            this.log.info(`(re)starting the server: ${reason}`);
            try {
                await this.stopClient();
                await this.start();
            } catch (error) {
                this.fail(`could not start the server: ${String(error)}`);
            }
        });
        return this.queue;
    }

    /** Restarts only when the interpreter the server would use is no longer the current one. */
    async restartIfInterpreterChanged(reason: string): Promise<void> {
        const next = await this.resolve(readSettingsFor(primaryFolder()?.uri));
        if (!sameInterpreter(next, this.interpreter)) {
            await this.restart(reason);
        }
    }

    async stop(): Promise<void> {
        this.disposed = true;
        await this.queue;
        await this.stopClient();
    }

    dispose(): void {
        void this.stop();
    }

    private async resolve(settings: ExtensionSettings): Promise<ResolvedInterpreter | undefined> {
        const folder = primaryFolder();
        return resolveInterpreter({
            setting: settings.interpreter,
            workspaceFolder: folder?.uri.fsPath,
            userHome: os.homedir(),
            env: process.env,
            platform: process.platform,
            pythonExtension: isPythonExtensionInstalled() ? () => activeInterpreter(folder?.uri) : undefined,
            isExecutable,
        });
    }

    private expand(value: string): string {
        return expandVariables(value, { workspaceFolder: primaryFolder()?.uri.fsPath, userHome: os.homedir(), env: process.env });
    }

    private serverSettingsFor(scope: vscode.Uri | undefined): ServerSettings {
        return serverSettings(readSettingsFor(scope), this.interpreter?.command, (value) => this.expand(value));
    }

    private async start(): Promise<void> {
        const settings = readSettingsFor(primaryFolder()?.uri);
        const trusted = vscode.workspace.isTrusted;
        this.status.setTrusted(trusted);
        this.status.show({ kind: "starting" });

        const interpreter = await this.resolve(settings);
        this.interpreter = interpreter;
        if (!interpreter) {
            this.fail("no Python interpreter found");
            void offerFixes({ kind: "noInterpreter" }, this.fixContext(settings));
            return;
        }
        const where = `${interpreter.command} (from ${describeSource(interpreter.source)})`;
        this.log.info(`interpreter: ${where}; importStrategy: ${settings.importStrategy}; trusted: ${trusted}`);

        if (settings.importStrategy === "useBundled" && !this.bundledAvailable) {
            this.fail("importStrategy is useBundled but this build of the extension has no bundled libraries");
            void offerFixes({ kind: "noBundle", interpreter }, this.fixContext(settings));
            return;
        }
        let bundledLibs: string | undefined;
        if (settings.importStrategy === "useBundled") {
            try {
                bundledLibs = await ensureBundledLibs({
                    python: [interpreter.command, ...interpreter.args],
                    zip: bundledZipPath(this.context.extensionPath),
                    storageDir: this.context.globalStorageUri.fsPath,
                    version: String(this.context.extension.packageJSON.version),
                });
            } catch (error) {
                this.fail(`could not unpack the bundled libraries with ${where}: ${String(error)}`);
                return;
            }
        }
        const plan = launchPlan(interpreter, bundledLibs, this.context.extensionPath, process.env);
        const check = await checkInterpreter(plan.command, interpreter.args, { cwd: plan.cwd, env: plan.env });
        if (check.kind !== "ok") {
            const reason =
                check.kind === "notRunnable"
                    ? `cannot run ${where}: ${check.detail}`
                    : check.kind === "pythonTooOld"
                      ? `${where} is Python ${check.python}; torchls needs 3.10 or newer`
                      : `torchls is not importable by ${where}: ${check.detail}`;
            this.fail(reason);
            void offerFixes({ kind: check.kind, interpreter, detail: reason }, this.fixContext(settings));
            return;
        }
        this.log.info(`torchls ${check.torchls} from ${check.location} (Python ${check.python})`);

        const client = createClient({
            plan,
            initializationOptions: initializationOptions(this.serverSettingsFor(primaryFolder()?.uri), trusted),
            currentSettings: (scope) => this.serverSettingsFor(scope ?? primaryFolder()?.uri),
            log: this.log,
        });
        client.onDidChangeState((event) => {
            // After a crash the client itself restarts the server a few times, then gives up.
            if (event.newState === State.Stopped && this.client === client) {
                this.status.show({ kind: "stopped", reason: "the server exited; see the log" });
            } else if (event.newState === State.Running && this.client === client) {
                this.status.show({ kind: "running", detail: this.runningDetail(check.torchls, check.python, where) });
            }
        });
        this.client = client;
        await client.start();
        this.status.show({ kind: "running", detail: this.runningDetail(check.torchls, check.python, where) });
    }

    private runningDetail(torchls: string, python: string, where: string): string {
        return `torchls ${torchls}, Python ${python}\n${where}`;
    }

    private fixContext(settings: ExtensionSettings): FixContext {
        return {
            log: this.log,
            settings,
            bundledAvailable: this.bundledAvailable,
            extensionPath: this.context.extensionPath,
            restart: (reason: string) => this.restart(reason),
        };
    }

    private fail(reason: string): void {
        this.log.error(reason);
        this.status.show({ kind: "error", reason });
    }

    private async stopClient(): Promise<void> {
        const client = this.client;
        this.client = undefined;
        if (!client) {
            return;
        }
        try {
            // Bounded: a hung server must not block the restart forever.
            await client.stop(2000);
        } catch (error) {
            this.log.warn(`stopping the server: ${String(error)}`);
        }
        await client.dispose().catch(() => undefined);
    }
}
