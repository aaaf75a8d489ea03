/**
 * The arguments torchls.runRepro and torchls.clearRepro send to the server. Pure, for tests.
 */

/** The argument the server expects: `{uri, device?, steps?}` (issue 5). */
export interface ReproArgument {
    readonly uri: string;
    readonly device?: string;
    readonly steps?: number;
}

/** Arguments given by a caller (a code action) win; from the palette, the active Python file. */
export function reproArguments(given: readonly unknown[], activeDocument: { uri: string; languageId: string } | undefined): unknown[] | undefined {
    if (given.length > 0 && given[0] !== undefined) {
        return [...given];
    }
    if (activeDocument?.languageId !== "python") {
        return undefined;
    }
    const argument: ReproArgument = { uri: activeDocument.uri };
    return [argument];
}
