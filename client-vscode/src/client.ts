/**
 * The language client for one server process: launch options, the settings it is given, and
 * the one change to vscode-languageclient's defaults that torchls needs (see ServerCommandsFeature).
 */

import * as vscode from "vscode";
import {
    type ClientCapabilities,
    type ConfigurationParams,
    DynamicFeature,
    ExecuteCommandRequest,
    type ExecuteCommandRegistrationOptions,
    type FeatureState,
    LanguageClient,
    type LanguageClientOptions,
    type RegistrationData,
    RevealOutputChannelOn,
    type ServerCapabilities,
    type ServerOptions,
    type StaticFeature,
    TransportKind,
} from "vscode-languageclient/node";
import type { LaunchPlan } from "./launch";
import { type InitializationOptions, type ServerSettings, SERVER_SECTION } from "./settings";

export const CLIENT_ID = "torchls";
const CLIENT_NAME = "torchls";

/**
 * Records the commands the server offers through `workspace/executeCommand`, without turning
 * them into VS Code commands.
 *
 * vscode-languageclient's own ExecuteCommandFeature registers a VS Code command for each command
 * the server announces. torchls.runRepro, torchls.clearRepro, torchls.showReproReport,
 * torchls.inspectCheckpoint and torchls.compareRepro are contributed by this extension (so they
 * exist, and can refuse clearly, before the server is up and in Restricted Mode, and so the
 * server's code actions that run them reach the extension's handlers); a second registration
 * of the same id would make the client fail to start.
 */
export class ServerCommandsFeature implements DynamicFeature<ExecuteCommandRegistrationOptions> {
    private readonly registrations = new Map<string, readonly string[]>();

    get registrationType() {
        return ExecuteCommandRequest.type;
    }

    fillClientCapabilities(capabilities: ClientCapabilities): void {
        capabilities.workspace ??= {};
        capabilities.workspace.executeCommand = { dynamicRegistration: true };
    }

    initialize(capabilities: ServerCapabilities): void {
        const commands = capabilities.executeCommandProvider?.commands;
        if (commands) {
            this.registrations.set("static", commands);
        }
    }

    register(data: RegistrationData<ExecuteCommandRegistrationOptions>): void {
        this.registrations.set(data.id, data.registerOptions.commands);
    }

    unregister(id: string): void {
        this.registrations.delete(id);
    }

    clear(): void {
        this.registrations.clear();
    }

    getState(): FeatureState {
        return { kind: "workspace", id: this.registrationType.method, registrations: this.registrations.size > 0 };
    }

    offers(command: string): boolean {
        return [...this.registrations.values()].some((commands) => commands.includes(command));
    }
}

export class TorchlsClient extends LanguageClient {
    // Called from the base constructor, so this override must not rely on instance fields.
    override registerFeature(feature: StaticFeature | DynamicFeature<unknown>): void {
        const replacesBuiltin =
            DynamicFeature.is(feature) &&
            feature.registrationType.method === ExecuteCommandRequest.method &&
            !(feature instanceof ServerCommandsFeature);
        super.registerFeature(replacesBuiltin ? new ServerCommandsFeature() : feature);
    }

    get serverCommands(): ServerCommandsFeature {
        return (this.getFeature as (method: string) => unknown)(ExecuteCommandRequest.method) as ServerCommandsFeature;
    }
}

export interface ClientInputs {
    readonly plan: LaunchPlan;
    readonly initializationOptions: InitializationOptions;
    /** Settings for `workspace/configuration`, read fresh at each request. */
    readonly currentSettings: (scope: vscode.Uri | undefined) => ServerSettings;
    readonly log: vscode.LogOutputChannel;
}

export function createClient(inputs: ClientInputs): TorchlsClient {
    const executable = {
        command: inputs.plan.command,
        args: [...inputs.plan.args],
        transport: TransportKind.stdio,
        options: { cwd: inputs.plan.cwd, env: inputs.plan.env },
    };
    const serverOptions: ServerOptions = { run: executable, debug: executable };
    const clientOptions: LanguageClientOptions = {
        documentSelector: [
            { scheme: "file", language: "python" },
            { scheme: "untitled", language: "python" },
            // Python cells of Jupyter notebooks: the server announces notebook sync for them, so
            // they reach it as notebookDocument/* (one module per notebook), while hover and code
            // actions in a cell need the cell to match here.
            { scheme: "vscode-notebook-cell", language: "python" },
        ],
        diagnosticCollectionName: CLIENT_ID,
        outputChannel: inputs.log,
        // vscode-languageclient traces only while this channel's log level is Trace; the
        // torchls.trace.server setting then picks "messages" or "verbose".
        traceOutputChannel: inputs.log,
        revealOutputChannelOn: RevealOutputChannelOn.Never,
        initializationOptions: inputs.initializationOptions,
        middleware: {
            workspace: {
                // Answer section `torchls` with the server's view (defaults filled in, probe.python
                // resolved) rather than the raw section with client-only keys.
                configuration: async (params: ConfigurationParams, token, next) => {
                    const answers = await next(params, token);
                    if (!Array.isArray(answers)) {
                        return answers;
                    }
                    return params.items.map((item, index) => {
                        if (item.section !== SERVER_SECTION) {
                            return answers[index];
                        }
                        const scope = item.scopeUri ? vscode.Uri.parse(item.scopeUri) : undefined;
                        return inputs.currentSettings(scope);
                    });
                },
            },
        },
    };
    return new TorchlsClient(CLIENT_ID, CLIENT_NAME, serverOptions, clientOptions);
}
