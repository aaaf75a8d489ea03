/**
 * The extension's settings (section `torchls`) read into one typed value, and the subset the
 * server understands. Pure: the `vscode` side hands in a `ConfigReader`, so tests can too.
 *
 * Values of the wrong type fall back to the default instead of reaching the server: a typo in
 * settings.json should not stop diagnostics. The server validates again on its side.
 */

export type RunMode = "onType" | "onSave";
export type ImportStrategy = "fromEnvironment" | "useBundled";

export interface ProbeSettings {
    readonly device: string;
    readonly steps: number;
    readonly timeout: number;
    readonly memory: number;
    /** Interpreter for the repro; empty means "the server's interpreter". */
    readonly python: string;
    /** The script's arguments, shell-quoted; empty: `[tool.torchls.probe]`'s. */
    readonly args: string;
    readonly spec: string;
    readonly cwd: string;
    readonly writable: readonly string[];
    readonly network: boolean;
    /** Ranks under torchrun (a distributed repro); null: one process. */
    readonly nproc: number | null;
    /**
     * "auto" | "bwrap" | "none"; any other string goes to the server as typed, so that its
     * warning names the allowed values (a typo then keeps the sandbox on, never off).
     */
    readonly sandbox: string;
}

export interface ExtensionSettings {
    readonly enable: boolean;
    /** null: let `[tool.torchls]` in pyproject.toml decide. */
    readonly select: readonly string[] | null;
    readonly ignore: readonly string[];
    readonly run: RunMode;
    readonly interpreter: readonly string[];
    readonly importStrategy: ImportStrategy;
    readonly probe: ProbeSettings;
}

/** What the server reads from initializationOptions and workspace/configuration. */
export interface ServerSettings {
    readonly enable: boolean;
    readonly select: readonly string[] | null;
    readonly ignore: readonly string[];
    readonly run: RunMode;
    readonly probe: ProbeSettings;
}

export interface InitializationOptions {
    readonly settings: ServerSettings;
    /** Whether the workspace may run code (the repro). The server assumes false when absent. */
    readonly trusted: boolean;
    /**
     * The client shows HTML reports itself (in a webview), so the server must not open them in
     * a browser.
     */
    readonly webviewReports: boolean;
}

/** Read access to section `torchls`; `key` is relative, e.g. "probe.steps". */
export interface ConfigReader {
    get(key: string): unknown;
}

export const DEFAULT_SETTINGS: ExtensionSettings = {
    enable: true,
    select: null,
    ignore: [],
    run: "onType",
    interpreter: [],
    importStrategy: "fromEnvironment",
    probe: {
        device: "auto",
        steps: 2,
        timeout: 60,
        memory: 4096,
        python: "",
        args: "",
        spec: "",
        cwd: "",
        writable: [],
        network: false,
        nproc: null,
        sandbox: "auto",
    },
};

/** Settings whose change needs a new server process; the rest reach it live. */
export const RESTART_SETTINGS: readonly string[] = ["torchls.interpreter", "torchls.importStrategy"];

/** Settings the server reads itself (via didChangeConfiguration + workspace/configuration). */
export const SERVER_SECTION = "torchls";

function stringList(value: unknown): string[] | undefined {
    if (typeof value === "string") {
        // "TL1, TL203" and "TL1 TL203" are how people type lists into a string field.
        return value.split(/[\s,]+/).filter((part) => part.length > 0);
    }
    if (Array.isArray(value) && value.every((item) => typeof item === "string")) {
        return value.filter((item) => item.length > 0);
    }
    return undefined;
}

function positiveNumber(value: unknown, fallback: number, integer: boolean): number {
    if (typeof value !== "number" || !Number.isFinite(value) || value <= 0) {
        return fallback;
    }
    return integer ? Math.max(1, Math.round(value)) : value;
}

/** A whole count of at least 1, or null ("not set": `[tool.torchls.probe]` decides). */
function optionalCount(value: unknown): number | null {
    if (typeof value !== "number" || !Number.isInteger(value) || value < 1) {
        return null;
    }
    return value;
}

function text(value: unknown): string {
    return typeof value === "string" ? value.trim() : "";
}

/** A list of paths: never split at spaces (a folder name may hold one). */
function stringArray(value: unknown): string[] {
    if (Array.isArray(value)) {
        return value.filter((item): item is string => typeof item === "string" && item.trim().length > 0);
    }
    return [];
}

function runMode(value: unknown): RunMode {
    const normalised = typeof value === "string" ? value.toLowerCase() : "";
    if (normalised === "onsave") {
        return "onSave";
    }
    return normalised === "ontype" ? "onType" : DEFAULT_SETTINGS.run;
}

export function readSettings(reader: ConfigReader): ExtensionSettings {
    const defaults = DEFAULT_SETTINGS;
    const enable = reader.get("enable");
    const select = reader.get("select");
    const interpreter = reader.get("interpreter");
    const device = reader.get("probe.device");
    const probePython = reader.get("probe.python");
    return {
        enable: typeof enable === "boolean" ? enable : defaults.enable,
        select: select === null || select === undefined ? null : (stringList(select) ?? null),
        ignore: stringList(reader.get("ignore")) ?? defaults.ignore,
        run: runMode(reader.get("run")),
        // A plain string is one path: "/opt/my python/bin/python" must not be split at spaces.
        interpreter: typeof interpreter === "string" ? (interpreter.trim() ? [interpreter.trim()] : []) : (stringList(interpreter) ?? []),
        importStrategy: reader.get("importStrategy") === "useBundled" ? "useBundled" : "fromEnvironment",
        probe: {
            device: typeof device === "string" && device.trim() ? device.trim() : defaults.probe.device,
            steps: positiveNumber(reader.get("probe.steps"), defaults.probe.steps, true),
            timeout: positiveNumber(reader.get("probe.timeout"), defaults.probe.timeout, false),
            memory: positiveNumber(reader.get("probe.memory"), defaults.probe.memory, true),
            python: typeof probePython === "string" ? probePython.trim() : "",
            args: text(reader.get("probe.args")),
            spec: text(reader.get("probe.spec")),
            cwd: text(reader.get("probe.cwd")),
            writable: stringArray(reader.get("probe.writable")),
            network: reader.get("probe.network") === true,
            nproc: optionalCount(reader.get("probe.nproc")),
            sandbox: text(reader.get("probe.sandbox")) || defaults.probe.sandbox,
        },
    };
}

/**
 * The server's view. `probe.python` defaults to the interpreter that runs the server: that is
 * the environment the user picked, so it is the one that has their torch.
 */
export function serverSettings(
    settings: ExtensionSettings,
    serverInterpreter: string | undefined,
    expand: (value: string) => string = (value) => value,
): ServerSettings {
    const probePython = settings.probe.python ? expand(settings.probe.python) : (serverInterpreter ?? "");
    return {
        enable: settings.enable,
        select: settings.select,
        ignore: settings.ignore,
        run: settings.run,
        probe: { ...settings.probe, python: probePython },
    };
}

export function initializationOptions(settings: ServerSettings, trusted: boolean): InitializationOptions {
    return { settings, trusted, webviewReports: true };
}

/** True when a configuration change touches a setting that only a restart applies. */
export function needsRestart(affectsConfiguration: (section: string) => boolean): boolean {
    return RESTART_SETTINGS.some((section) => affectsConfiguration(section));
}
