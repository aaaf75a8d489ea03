/**
 * What to tell the user when the server cannot start, and which fixes to offer: the pure half
 * of missingServer.ts, so tests can check every case without VS Code.
 */

import type { ResolvedInterpreter } from "./interpreter";
import type { ExtensionSettings } from "./settings";

export type StartProblem =
    | { readonly kind: "noInterpreter" }
    | { readonly kind: "noBundle"; readonly interpreter: ResolvedInterpreter }
    | {
          readonly kind: "notRunnable" | "pythonTooOld" | "torchlsMissing";
          readonly interpreter: ResolvedInterpreter;
          readonly detail: string;
      };

export const SELECT = "Select Interpreter";
export const INSTALL = "Install torchls";
export const USE_BUNDLED = "Use Bundled";
export const USE_ENVIRONMENT = "Use Environment";
export const SHOW_LOG = "Show Log";

export function messageFor(problem: StartProblem): string {
    switch (problem.kind) {
        case "noInterpreter":
            return "torchls: no Python interpreter found. Select one (Python 3.10 or newer) to run the torchls server.";
        case "noBundle":
            return "torchls: torchls.importStrategy is useBundled, but this build of the extension has no bundled libraries.";
        case "notRunnable":
        case "pythonTooOld":
            return `torchls: ${problem.detail}. Select another interpreter.`;
        case "torchlsMissing":
            return `torchls is not installed in ${problem.interpreter.command}. Install it there, select an interpreter that has it, or use the copy bundled with the extension.`;
    }
}

export function actionsFor(problem: StartProblem, settings: ExtensionSettings, bundledAvailable: boolean): string[] {
    switch (problem.kind) {
        case "noInterpreter":
        case "notRunnable":
        case "pythonTooOld":
            return [SELECT, SHOW_LOG];
        case "noBundle":
            return [USE_ENVIRONMENT, SHOW_LOG];
        case "torchlsMissing": {
            // Three buttons at most: a fourth gets its label cut off. The log is one click away
            // on the status bar item.
            const actions = [SELECT, INSTALL];
            if (bundledAvailable && settings.importStrategy !== "useBundled") {
                actions.push(USE_BUNDLED);
            }
            return actions;
        }
    }
}

