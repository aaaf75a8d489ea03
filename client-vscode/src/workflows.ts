/**
 * torchls.showReproReport, torchls.inspectCheckpoint and torchls.compareRepro: what each sends to
 * the server's `workspace/executeCommand` and how its answer is shown. Free of `vscode` at run
 * time: the editor side is a `WorkflowHost` (workflowCommands.ts adapts VS Code to it), so the
 * unit tests drive these with a fake one.
 *
 * Server contract:
 *  - torchls.showReproReport [documentUri] -> {path, html}: the self-contained HTML report of
 *    the newest repro of that document (an error when there is none);
 *  - torchls.inspectCheckpoint [path] -> {status: "ok"|"blocked"|"error", markdown, loads};
 *  - torchls.compareRepro [documentUri, baseline] -> {status, exit_status, markdown}.
 */

export const SHOW_REPRO_REPORT = "torchls.showReproReport";
export const INSPECT_CHECKPOINT = "torchls.inspectCheckpoint";
export const COMPARE_REPRO = "torchls.compareRepro";
export const COMPARE_BASELINE = "HEAD";
export const SHOW_REPORT_ACTION = "Show Report";

/**
 * The webview's own policy, on top of the one the report carries: nothing but inline styles
 * and data: images (the charts are inline SVG). Several policies all apply, so this one can
 * only tighten whatever the page says.
 */
export const REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:";

export interface WebviewSpec {
    readonly viewType: string;
    readonly title: string;
    readonly html: string;
    readonly options: { readonly enableScripts: false; readonly enableForms: false; readonly localResourceRoots: readonly never[] };
}

export const REPORT_VIEW_TYPE = "torchls.reproReport";
/** No scripts, no forms, no files from disk: the report is one page that needs none of them. */
export const REPORT_WEBVIEW_OPTIONS: WebviewSpec["options"] = { enableScripts: false, enableForms: false, localResourceRoots: [] };

export const CHECKPOINT_FILTERS: Readonly<Record<string, readonly string[]>> = {
    Checkpoints: ["pt", "pth", "ckpt", "bin", "safetensors"],
};

/** The active editor's document, when it is a Python file. */
export interface ActiveDocument {
    readonly uri: string;
    /** The file's name, for titles. */
    readonly name: string;
    readonly isDirty: boolean;
    save(): Promise<unknown>;
}

export interface WorkflowHost {
    isTrusted(): boolean;
    /** Says why Restricted Mode disables a command, with a way to manage trust. */
    refuseUntrusted(message: string): Promise<void>;
    activePythonDocument(): ActiveDocument | undefined;
    /** Whether the running server announces `command` (false while it is down). */
    serverOffers(command: string): boolean;
    /**
     * Sends `workspace/executeCommand`; undefined when the server is not running or does not
     * offer the command (the user has been told). Rejects with the server's error.
     */
    request(command: string, args: unknown[]): Promise<unknown>;
    showWebview(spec: WebviewSpec): void;
    showMarkdown(name: string, markdown: string): Promise<void>;
    pickFile(title: string, filters: Readonly<Record<string, readonly string[]>>): Promise<string | undefined>;
    info(message: string, ...actions: string[]): Promise<string | undefined>;
    error(message: string): void;
    runCommand(command: string, ...args: unknown[]): Promise<unknown>;
}

export interface ReportResult {
    readonly path: string;
    readonly html: string;
}

export interface InspectResult {
    readonly status: string;
    readonly markdown: string;
    readonly loads: boolean | null;
}

export interface CompareResult {
    readonly status: string;
    /** 0: the candidate removes the baseline's findings and adds none; null: it could not run. */
    readonly exitStatus: number | null;
    readonly markdown: string;
}

function isRecord(value: unknown): value is Record<string, unknown> {
    return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function parseReportResult(value: unknown): ReportResult | undefined {
    if (isRecord(value) && typeof value.html === "string" && value.html.length > 0) {
        return { path: typeof value.path === "string" ? value.path : "", html: value.html };
    }
    return undefined;
}

export function parseInspectResult(value: unknown): InspectResult | undefined {
    if (isRecord(value) && typeof value.markdown === "string") {
        const loads = typeof value.loads === "boolean" ? value.loads : null;
        return { status: typeof value.status === "string" ? value.status : "error", markdown: value.markdown, loads };
    }
    return undefined;
}

export function parseCompareResult(value: unknown): CompareResult | undefined {
    if (isRecord(value) && typeof value.markdown === "string") {
        const exitStatus = typeof value.exit_status === "number" ? value.exit_status : null;
        return { status: typeof value.status === "string" ? value.status : "", exitStatus, markdown: value.markdown };
    }
    return undefined;
}

function escapeAttribute(value: string): string {
    return value.replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;");
}

/** The report's HTML with REPORT_CSP as the first element of its head. */
export function withContentSecurityPolicy(html: string, policy: string = REPORT_CSP): string {
    const meta = `<meta http-equiv="Content-Security-Policy" content="${escapeAttribute(policy)}">`;
    const head = /<head(\s[^>]*)?>/i.exec(html);
    if (head) {
        const end = head.index + head[0].length;
        return `${html.slice(0, end)}\n${meta}${html.slice(end)}`;
    }
    // No <head>: a <meta> before any content still lands in the head the parser makes up.
    const doctype = /^\s*<!doctype[^>]*>/i.exec(html);
    const at = doctype ? doctype[0].length : 0;
    return `${html.slice(0, at)}${meta}${html.slice(at)}`;
}

/** The last path segment of a URI, decoded: "file:///p/train%201.py" -> "train 1.py". */
export function uriName(uri: string): string {
    const segment = uri.split(/[?#]/, 1)[0]?.split("/").filter((part) => part.length > 0).at(-1) ?? uri;
    try {
        return decodeURIComponent(segment);
    } catch {
        return segment;
    }
}

export function reportTitle(documentName: string): string {
    return `Repro Report: ${documentName}`;
}

export function restrictedMessage(reason: string): string {
    return `torchls: ${reason}, so it is disabled in Restricted Mode. Trust this workspace to use it.`;
}

function errorText(error: unknown): string {
    return error instanceof Error ? error.message : String(error);
}

/** The document a run of torchls.runRepro was for: its `{uri}` argument. */
export function reproDocumentUri(args: readonly unknown[]): string | undefined {
    const first = args[0];
    return isRecord(first) && typeof first.uri === "string" ? first.uri : undefined;
}

/**
 * Whether a torchls.runRepro answer is a finished run with a report: not a refusal, a failure
 * to start, a cancellation or the "started" of a run that reports later.
 */
export function reproHasReport(result: unknown): result is { status: string; message?: unknown } {
    if (!isRecord(result) || typeof result.status !== "string") {
        return false;
    }
    return !["started", "cancelled", "failed", "refused", "cleared"].includes(result.status);
}

/**
 * The run's summary for the notice, without the pointer to torchls.showReproReport that the
 * server appends for webview clients: the notice's button is that pointer.
 */
export function reproSummary(message: unknown): string | undefined {
    if (typeof message !== "string") {
        return undefined;
    }
    const summary = message.replace(/[.\s]*Its HTML report: torchls\.showReproReport\.?\s*$/, "").trim();
    return summary || undefined;
}

export class Workflows {
    constructor(private readonly host: WorkflowHost) {}

    /** torchls.showReproReport: the HTML report of `documentUri` (default: the active Python file). */
    async showReproReport(documentUri?: string): Promise<ReportResult | undefined> {
        const active = this.host.activePythonDocument();
        const uri = documentUri ?? active?.uri;
        if (!uri) {
            void this.host.info("torchls: open the Python training script whose repro report to show.");
            return undefined;
        }
        let answer: unknown;
        try {
            answer = await this.host.request(SHOW_REPRO_REPORT, [uri]);
        } catch (error) {
            this.host.error(`torchls: no repro report to show: ${errorText(error)}`);
            return undefined;
        }
        if (answer === undefined) {
            return undefined; // the server is down or too old; the user has been told
        }
        const report = parseReportResult(answer);
        if (!report) {
            this.host.error("torchls: the server's answer to torchls.showReproReport has no report.");
            return undefined;
        }
        this.host.showWebview({
            viewType: REPORT_VIEW_TYPE,
            title: reportTitle(uriName(uri)),
            html: withContentSecurityPolicy(report.html),
            options: REPORT_WEBVIEW_OPTIONS,
        });
        return report;
    }

    /** torchls.inspectCheckpoint: `path`, or a file the user picks. Runs torch.load's checks, so trusted only. */
    async inspectCheckpoint(path?: string): Promise<InspectResult | undefined> {
        if (!this.host.isTrusted()) {
            await this.host.refuseUntrusted(restrictedMessage("inspecting a checkpoint unpickles it, which can run code"));
            return undefined;
        }
        const file = path ?? (await this.host.pickFile("Inspect Checkpoint", CHECKPOINT_FILTERS));
        if (!file) {
            return undefined;
        }
        let answer: unknown;
        try {
            answer = await this.host.request(INSPECT_CHECKPOINT, [file]);
        } catch (error) {
            this.host.error(`torchls: could not inspect ${uriName(file)}: ${errorText(error)}`);
            return undefined;
        }
        if (answer === undefined) {
            return undefined;
        }
        const result = parseInspectResult(answer);
        if (!result) {
            this.host.error("torchls: the server's answer to torchls.inspectCheckpoint has no report.");
            return undefined;
        }
        await this.host.showMarkdown(`${uriName(file)}.md`, result.markdown);
        return result;
    }

    /**
     * torchls.compareRepro: the active Python file (or `documentUri`, from the server's code
     * action) against its version at `baseline` (HEAD). Runs both, so trusted only.
     */
    async compareWithHead(documentUri?: string, baseline: string = COMPARE_BASELINE): Promise<CompareResult | undefined> {
        if (!this.host.isTrusted()) {
            await this.host.refuseUntrusted(restrictedMessage(`the comparison runs your training code, at ${baseline} and as it is now`));
            return undefined;
        }
        const active = this.host.activePythonDocument();
        const uri = documentUri ?? active?.uri;
        if (!uri) {
            void this.host.info(`torchls: open the Python training script to compare with ${baseline}.`);
            return undefined;
        }
        if (active && active.uri === uri && active.isDirty) {
            await active.save(); // the working copy is run from disk
        }
        let answer: unknown;
        try {
            answer = await this.host.request(COMPARE_REPRO, [uri, baseline]);
        } catch (error) {
            this.host.error(`torchls: the comparison with ${baseline} failed: ${errorText(error)}`);
            return undefined;
        }
        if (answer === undefined) {
            return undefined;
        }
        const result = parseCompareResult(answer);
        if (!result) {
            this.host.error("torchls: the server's answer to torchls.compareRepro has no report.");
            return undefined;
        }
        await this.host.showMarkdown(`${uriName(uri)} vs ${uriName(baseline)}.md`, result.markdown);
        return result;
    }

    /**
     * After torchls.runRepro answered: a finished run gets a notice with "Show Report", when
     * the server can show one. Not awaited by the caller: the command's answer must not wait
     * for a click.
     */
    async afterRepro(args: readonly unknown[], result: unknown): Promise<void> {
        const uri = reproDocumentUri(args);
        if (!uri || !reproHasReport(result) || !this.host.serverOffers(SHOW_REPRO_REPORT)) {
            return;
        }
        const summary = reproSummary(result.message) ?? `the repro of ${uriName(uri)} finished`;
        const choice = await this.host.info(`torchls: ${summary}`, SHOW_REPORT_ACTION);
        if (choice === SHOW_REPORT_ACTION) {
            await this.host.runCommand(SHOW_REPRO_REPORT, uri);
        }
    }
}
