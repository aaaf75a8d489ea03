/**
 * End-to-end test in a real VS Code: code-server (npm) + Debian's chromium (puppeteer-core).
 *
 * Scenarios, each in a fresh code-server with its own user data:
 *  - trusted:    the built .vsix, torchls.interpreter = $TORCHLS_VENV/bin/python; the buggy
 *                example shows TL101 on line 65 in the Problems panel; the server process runs
 *                in code-server's process group; the status bar item says it is running;
 *                setting torchls.ignore = ["TL101"] removes it without a restart.
 *  - restricted: Workspace Trust on and the folder untrusted: TL101 still shows, the server was
 *                told trusted: false, and torchls.runRepro refuses with a clear message.
 *  - forwarding: a stub server (fixtures/fake_repro_server.py) that offers torchls.runRepro and
 *                torchls.clearRepro: the client starts (no command clash) and both commands
 *                reach it with {uri}. Independent of the real repro, which is a later issue.
 *  - install:    a new venv without torchls: "Install torchls" pip-installs the wheel shipped in
 *                the .vsix into it (dependencies from the package index) and TL101 appears.
 *  - bundled:    an interpreter without torchls: the "not installed" message offers its fixes;
 *                "Use Bundled" switches importStrategy and TL101 appears.
 *  - report:     the real server runs a real repro of a small training script (fixtures/
 *                tiny_train.py, on the CPU); its notice offers "Show Report";
 *                "torchls: Show Repro Report" opens the report in a webview panel whose page
 *                carries the extension's Content-Security-Policy. Then a script whose NaN is born
 *                on one line (fixtures/nan_train.py): the repro puts TL901 on that line in the
 *                Problems panel, and the hover on its squiggle shows the repro's trace.
 *  - notebook:   a Jupyter notebook (fixtures/softmax_loss.ipynb) opened in the notebook editor:
 *                TL101 on line 4 of its fifth cell in the Problems panel (notebook sync), the
 *                quick fix menu in that cell offers "Fix TL101", choosing it removes the problem.
 * Screenshots go to test-results/. Every process group started is stopped and checked.
 *
 * Inputs: TORCHLS_VENV (required), CODE_SERVER_BIN (else scripts/install-code-server.sh),
 * CHROMIUM_BIN (/usr/bin/chromium), TORCHLS_VSIX (else the newest torchls-*.vsix here),
 * TORCHLS_E2E_BARE_PYTHON (/usr/bin/python3; the bundled scenario is skipped if it has torchls),
 * TORCHLS_E2E_PIDFILE (group ids are appended for the caller's cleanup trap), TORCHLS_E2E_ONLY
 * (comma-separated scenario names), TORCHLS_E2E_LOG (code-server --log level, e.g. trace).
 */

import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import type { Browser } from "puppeteer-core";
import { CodeServer } from "./codeServer";
import { commandLine, processesInGroup } from "./processes";
import { launchBrowser, Workbench } from "./workbench";

const clientDir = path.resolve(__dirname, "..", "..");
const repoRoot = path.resolve(clientDir, "..");
const resultsDir = path.join(clientDir, "test-results");
const EXAMPLE = "image_classifier.py";
const EXPECTED_CODE = "TL101";
const EXPECTED_LINE = 65;
const REPORT_SCRIPT = "tiny_train.py";
const NAN_SCRIPT = "nan_train.py";
const NAN_LINE = 16; // `shifted = torch.sqrt(inputs - 10.0)` in fixtures/nan_train.py
const NOTEBOOK = "softmax_loss.ipynb"; // fixtures/: TL101 on line 4 of cell 5
const NOTEBOOK_LINE = 4;
const OVERALL_TIMEOUT_MS = 540_000;

function fail(message: string): never {
    throw new Error(message);
}

function venvPython(): string {
    const venv = process.env.TORCHLS_VENV ?? fail("TORCHLS_VENV must point at a venv with torchls installed");
    const python = path.resolve(venv, "bin", "python");
    return fs.existsSync(python) ? python : fail(`no interpreter at ${python}`);
}

function codeServerBinary(): string {
    if (process.env.CODE_SERVER_BIN) {
        return process.env.CODE_SERVER_BIN;
    }
    // Cached after the first run; prints the binary's path.
    const script = path.join(clientDir, "scripts", "install-code-server.sh");
    return execFileSync("bash", [script], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
}

function builtVsix(): string {
    if (process.env.TORCHLS_VSIX) {
        return path.resolve(process.env.TORCHLS_VSIX);
    }
    const candidates = fs
        .readdirSync(clientDir)
        .filter((name) => /^torchls-.*\.vsix$/.test(name))
        .map((name) => path.join(clientDir, name))
        .sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs);
    return candidates[0] ?? fail("no torchls-*.vsix here: run `npm run package` first");
}

function hasTorchls(python: string): boolean {
    try {
        execFileSync(python, ["-c", "import torchls"], { stdio: "ignore", cwd: os.tmpdir() });
        return true;
    } catch {
        return false;
    }
}

/** User settings shared by every scenario: quiet, deterministic start-up. */
function baseSettings(): Record<string, unknown> {
    return {
        "workbench.startupEditor": "none",
        "workbench.tips.enabled": false,
        "workbench.enableExperiments": false,
        "extensions.ignoreRecommendations": true,
        "extensions.autoCheckUpdates": false,
        "extensions.autoUpdate": false,
        "telemetry.telemetryLevel": "off",
        "update.mode": "none",
        "chat.commandCenter.enabled": false,
        "window.commandCenter": false,
        "editor.minimap.enabled": false,
        "editor.hover.delay": 100,
        "files.autoSave": "off",
        "git.enabled": false,
    };
}

function makeWorkspace(root: string): string {
    const workspace = path.join(root, "workspace");
    fs.mkdirSync(workspace, { recursive: true });
    fs.copyFileSync(path.join(repoRoot, "examples", EXAMPLE), path.join(workspace, EXAMPLE));
    return workspace;
}

function workspaceOf(server: CodeServer): string {
    return path.join(server.root, "workspace");
}

function writeWorkspaceSettings(workspace: string, settings: Record<string, unknown>): void {
    fs.mkdirSync(path.join(workspace, ".vscode"), { recursive: true });
    fs.writeFileSync(path.join(workspace, ".vscode", "settings.json"), JSON.stringify(settings, null, 2));
}

interface Scenario {
    readonly name: string;
    readonly settings: Record<string, unknown>;
    readonly trustEverything: boolean;
    /** Extra setup in the scenario's folder; returns settings to add. */
    readonly prepare?: (root: string) => Record<string, unknown>;
    readonly body: (workbench: Workbench, server: CodeServer) => Promise<void>;
}

function log(message: string): void {
    console.log(`[e2e ${new Date().toISOString().slice(11, 19)}] ${message}`);
}

async function expectTL101(workbench: Workbench, scenario: string): Promise<void> {
    await workbench.openFile(EXAMPLE);
    await workbench.goToLine(EXPECTED_LINE);
    await workbench.waitForSquiggle(60_000);
    const rows = await workbench.problemsContaining(EXPECTED_CODE, 30_000);
    const row = rows.find((text) => text.includes(EXPECTED_CODE)) ?? "";
    log(`${scenario}: Problems row: ${row}`);
    if (!row.includes(`Ln ${EXPECTED_LINE}`)) {
        fail(`${scenario}: ${EXPECTED_CODE} is not on line ${EXPECTED_LINE}: ${row}`);
    }
}

async function runScenario(browser: Browser, binary: string, vsix: string, scenario: Scenario, pidFile?: string): Promise<void> {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), `torchls-e2e-${scenario.name}-`));
    const settings = { ...scenario.settings, ...scenario.prepare?.(root) };
    const server = await CodeServer.prepare({ binary, root, settings, trustEverything: scenario.trustEverything, pidFile });
    let workbench: Workbench | undefined;
    let failed = false;
    try {
        await server.installExtension(vsix);
        await server.start(makeWorkspace(root));
        log(`${scenario.name}: code-server up on ${server.url} (process group ${server.pgid})`);
        workbench = await Workbench.open(browser, server.url, workspaceOf(server), resultsDir);
        await scenario.body(workbench, server);
        log(`${scenario.name}: passed`);
    } catch (error) {
        failed = true;
        if (workbench) {
            await workbench.screenshot(`${scenario.name}-failure`).catch(() => undefined);
        }
        throw error;
    } finally {
        const logs = `== code-server\n${server.logTail(200)}\n${server.extensionLog()}`;
        fs.writeFileSync(path.join(resultsDir, `${scenario.name}-logs.txt`), logs);
        if (failed) {
            console.error(logs.split("\n").slice(-60).join("\n"));
        }
        await workbench?.page.close().catch(() => undefined);
        const survivors = await server.stop();
        fs.rmSync(root, { recursive: true, force: true });
        if (survivors.length > 0) {
            // Reported even when the scenario itself failed: a leak is its own bug.
            console.error(`${scenario.name}: processes survived the group stop: ${survivors.map((pid) => `${pid} ${commandLine(pid)}`).join("; ")}`);
            if (!failed) {
                fail(`${scenario.name}: processes survived the group stop`);
            }
        }
    }
}

function scenarios(python: string): Scenario[] {
    const trusted: Scenario = {
        name: "trusted",
        trustEverything: true,
        settings: { ...baseSettings(), "torchls.interpreter": [python] },
        body: async (workbench, server) => {
            await expectTL101(workbench, "trusted");
            const servers = processesInGroup(server.pgid ?? -1)
                .map(commandLine)
                .filter((line) => line.includes("-m torchls server"));
            log(`trusted: server processes in code-server's group: ${servers.join("; ")}`);
            if (!servers.some((line) => line.startsWith(python))) {
                fail(`trusted: no "${python} -m torchls server" in code-server's process group`);
            }
            const status = await workbench.statusBarEntry("torchls");
            log(`trusted: status bar: ${status}`);
            if (!status || /error|sync~spin/.test(status)) {
                fail(`trusted: the status bar item does not show a running server: ${status}`);
            }
            await workbench.screenshot("trusted-problems");
            if (await workbench.hoverFirstSquiggle()) {
                await workbench.screenshot("trusted-hover");
            }
            // Settings reach the running server without a restart (didChangeConfiguration, then
            // workspace/configuration answered by the extension's middleware).
            // Written as workspace settings: VS Code watches the workspace's files for sure, while
            // code-server did not pick up a rewritten user settings.json.
            writeWorkspaceSettings(workspaceOf(server), { "torchls.ignore": [EXPECTED_CODE] });
            await workbench.problemsWithout(EXPECTED_CODE, "TL204", 30_000);
            log(`trusted: torchls.ignore = ["${EXPECTED_CODE}"] removed it live`);
        },
    };
    const restricted: Scenario = {
        name: "restricted",
        trustEverything: false,
        settings: {
            ...baseSettings(),
            "torchls.interpreter": [python],
            "security.workspace.trust.enabled": true,
            // No modal on start-up: the folder simply opens in Restricted Mode.
            "security.workspace.trust.startupPrompt": "never",
        },
        body: async (workbench, server) => {
            await expectTL101(workbench, "restricted");
            await workbench.runCommand("torchls: Run Repro");
            const refusal = await workbench.notificationContaining("Restricted Mode", 15_000);
            log(`restricted: runRepro answered: ${refusal}`);
            await workbench.screenshot("restricted-repro-refused");
            const extensionLog = server.extensionLog();
            if (!extensionLog.includes("trusted: false")) {
                fail("restricted: the extension log does not show the server started with trusted: false");
            }
        },
    };
    const bare = process.env.TORCHLS_E2E_BARE_PYTHON ?? "/usr/bin/python3";
    const bundled: Scenario = {
        name: "bundled",
        trustEverything: true,
        settings: { ...baseSettings(), "torchls.interpreter": [bare] },
        body: async (workbench, server) => {
            const message = await workbench.notificationContaining("torchls is not installed", 60_000);
            log(`bundled: message: ${message}`);
            for (const action of ["Select Interpreter", "Install torchls", "Use Bundled"]) {
                if (!message.includes(action)) {
                    fail(`bundled: the message has no "${action}" action: ${message}`);
                }
            }
            await workbench.screenshot("bundled-missing-torchls");
            await workbench.clickNotificationButton("Use Bundled");
            await expectTL101(workbench, "bundled");
            // The server really runs the unpacked bundle, not some other torchls.
            const lines = server.extensionLog().split("\n").filter((line) => line.includes("torchls 0") && line.includes(" from "));
            log(`bundled: ${lines.at(-1)?.replace(/^.*\] /, "")}`);
            if (!lines.at(-1)?.includes("bundled-libs-")) {
                fail(`bundled: the server did not start from the unpacked bundle: ${lines.at(-1)}`);
            }
            await workbench.screenshot("bundled-problems");
        },
    };
    const forwarding: Scenario = {
        name: "forwarding",
        trustEverything: true,
        settings: { ...baseSettings(), "torchls.interpreter": [python, path.join(clientDir, "test", "e2e", "fixtures", "fake_repro_server.py")] },
        body: async (workbench) => {
            await workbench.openFile(EXAMPLE);
            await workbench.waitForStatusBar("torchls", "running", 30_000);
            await workbench.runCommand("torchls: Run Repro");
            const rows = await workbench.problemsContaining("TL901", 30_000);
            const row = rows.find((text) => text.includes("TL901")) ?? "";
            log(`forwarding: Problems row: ${row}`);
            if (!row.includes("fake repro ran with ['uri']")) {
                fail(`forwarding: torchls.runRepro did not reach the server with {uri}: ${row}`);
            }
            await workbench.runCommand("torchls: Clear Repro Results");
            await workbench.problemsWithout("TL901", undefined, 30_000);
            log("forwarding: torchls.clearRepro cleared it");
        },
    };
    const install: Scenario = {
        name: "install",
        trustEverything: true,
        settings: { ...baseSettings() }, // the interpreter is set in prepare(), once the venv exists
        prepare: (root) => {
            // A new venv without torchls, made from the project's interpreter.
            const venv = path.join(root, "bare-venv");
            execFileSync(python, ["-m", "venv", venv], { stdio: "inherit" });
            return { "torchls.interpreter": [path.join(venv, "bin", "python")] };
        },
        body: async (workbench) => {
            const message = await workbench.notificationContaining("torchls is not installed", 60_000);
            log(`install: message: ${message}`);
            await workbench.clickNotificationButton("Install torchls");
            // pip installs the wheel shipped in the .vsix (and its dependencies from the index).
            await workbench.notificationContaining("installed into", 120_000);
            await expectTL101(workbench, "install");
        },
    };
    const report: Scenario = {
        name: "report",
        trustEverything: true,
        settings: { ...baseSettings(), "torchls.interpreter": [python], "torchls.probe.device": "cpu", "torchls.probe.steps": 2 },
        prepare: (root) => {
            const workspace = path.join(root, "workspace");
            fs.mkdirSync(workspace, { recursive: true });
            for (const script of [REPORT_SCRIPT, NAN_SCRIPT]) {
                fs.copyFileSync(path.join(clientDir, "test", "e2e", "fixtures", script), path.join(workspace, script));
            }
            return {};
        },
        body: async (workbench) => {
            await workbench.openFile(REPORT_SCRIPT);
            await workbench.waitForStatusBar("torchls", "running", 60_000);
            await workbench.runCommand("torchls: Run Repro");
            // The first run is cold (the sandbox imports torch).
            // Its notice (not the progress toast, which shows the same summary) has "Show Report".
            const notice = await workbench
                .notificationContaining(`repro of ${REPORT_SCRIPT}`, 120_000, "Show Report")
                .catch((error: unknown) => fail(`report: no notice of the finished repro with "Show Report": ${String(error)}`));
            log(`report: repro notice: ${notice}`);
            await workbench.screenshot("report-repro-done");
            await workbench.runCommand("torchls: Show Repro Report");
            let tab: string;
            try {
                tab = await workbench.waitForTab(`Repro Report: ${REPORT_SCRIPT}`, 30_000);
            } catch {
                const errors = await workbench.notificationContaining("torchls", 1_000).catch(() => "no torchls notification");
                fail(`report: "torchls: Show Repro Report" opened no "Repro Report: ${REPORT_SCRIPT}" tab (does the server offer torchls.showReproReport?): ${errors}`);
            }
            log(`report: tab: ${tab}`);
            const page = await workbench.webviewContaining("torchls repro", 30_000);
            log(`report: webview text starts: ${page.text.slice(0, 120).replace(/\s+/g, " ")}; policies: ${JSON.stringify(page.policies)}`);
            if (!page.text.includes(REPORT_SCRIPT.replace(/\.py$/, ""))) {
                fail(`report: the webview does not show the report of ${REPORT_SCRIPT}`);
            }
            if (!page.policies.includes("default-src 'none'; style-src 'unsafe-inline'; img-src data:")) {
                fail(`report: the webview's page lacks the extension's Content-Security-Policy: ${JSON.stringify(page.policies)}`);
            }
            // Charts are inline SVG: let them lay out before the screenshot.
            await new Promise((resolve) => setTimeout(resolve, 1_000));
            await workbench.screenshot("report-webview");

            // A real NaN: TL901 on the line that made it, and the trace in the hover there.
            await workbench.openFile(NAN_SCRIPT);
            await workbench.runCommand("torchls: Run Repro");
            const rows = await workbench
                .problemsContaining("TL901", 120_000)
                .catch((error: unknown) => fail(`report: no TL901 in the Problems panel after the repro of ${NAN_SCRIPT}: ${String(error)}`));
            const row = rows.find((text) => text.includes("TL901")) ?? "";
            log(`report: Problems row: ${row}`);
            if (!row.includes(`Ln ${NAN_LINE}`) || !row.includes("torch.sqrt")) {
                fail(`report: TL901 is not on line ${NAN_LINE} at torch.sqrt: ${row}`);
            }
            await workbench.goToLine(NAN_LINE);
            const hover = await workbench.hoverErrorSquiggleText(30_000);
            log(`report: hover starts: ${hover.slice(0, 200).replace(/\s+/g, " ")}`);
            if (!hover.includes("First non-finite value") || !hover.includes("torch.sqrt") || !hover.includes("NaN")) {
                fail(`report: the hover on the TL901 squiggle does not show the repro trace: ${hover.slice(0, 400)}`);
            }
            await workbench.screenshot("report-nan-hover");
        },
    };
    // A Jupyter notebook: the softmax written into cell 5's loss call is TL101 there, its quick
    // fix (offered in the cell, through notebook sync) removes it and the problem goes away.
    const notebook: Scenario = {
        name: "notebook",
        trustEverything: true,
        settings: { ...baseSettings(), "torchls.interpreter": [python] },
        prepare: (root) => {
            const workspace = path.join(root, "workspace");
            fs.mkdirSync(workspace, { recursive: true });
            fs.copyFileSync(path.join(clientDir, "test", "e2e", "fixtures", NOTEBOOK), path.join(workspace, NOTEBOOK));
            return {};
        },
        body: async (workbench) => {
            await workbench.openFile(NOTEBOOK);
            const rows = await workbench
                .problemsContaining(EXPECTED_CODE, 90_000)
                .catch((error: unknown) => fail(`notebook: no ${EXPECTED_CODE} in the Problems panel for ${NOTEBOOK}: ${String(error)}`));
            const row = rows.find((text) => text.includes(EXPECTED_CODE)) ?? "";
            log(`notebook: Problems row: ${row}`);
            if (!row.includes(`Ln ${NOTEBOOK_LINE}`)) {
                fail(`notebook: ${EXPECTED_CODE} is not on line ${NOTEBOOK_LINE} of its cell: ${row}`);
            }
            await workbench.screenshot("notebook-problem");
            const menu = await workbench.quickFixMenuAtProblem(EXPECTED_CODE, 30_000);
            log(`notebook: quick fix menu: ${menu.join(" | ")}`);
            const fix = menu.find((title) => title.startsWith(`Fix ${EXPECTED_CODE}`));
            if (!fix) {
                fail(`notebook: the quick fix menu in the cell has no "Fix ${EXPECTED_CODE}": ${menu.join(" | ")}`);
            }
            await workbench.screenshot("notebook-quick-fix");
            await workbench.chooseQuickFix(fix);
            await workbench.runCommand("View: Focus Problems");
            await workbench.problemsWithout(EXPECTED_CODE, undefined, 30_000);
            log(`notebook: "${fix}" applied in the cell; ${EXPECTED_CODE} is gone`);
        },
    };
    const list = [trusted, restricted, forwarding, install, report, notebook];
    if (fs.existsSync(bare) && !hasTorchls(bare)) {
        list.push(bundled);
    } else {
        log(`skipping the bundled scenario: ${bare} is missing or already has torchls`);
    }
    return list;
}

async function main(): Promise<void> {
    const python = venvPython();
    const binary = codeServerBinary();
    const vsix = builtVsix();
    const chromium = process.env.CHROMIUM_BIN ?? "/usr/bin/chromium";
    const only = process.env.TORCHLS_E2E_ONLY?.split(",");
    fs.rmSync(resultsDir, { recursive: true, force: true });
    fs.mkdirSync(resultsDir, { recursive: true });
    log(`vsix ${vsix}; code-server ${binary}; interpreter ${python}`);

    const browserHome = fs.mkdtempSync(path.join(os.tmpdir(), "torchls-e2e-chromium-"));
    const browser = await launchBrowser(chromium, browserHome);
    const browserPid = browser.process()?.pid;
    if (browserPid && process.env.TORCHLS_E2E_PIDFILE) {
        // puppeteer starts chromium in its own process group; record it for the caller's trap.
        fs.appendFileSync(process.env.TORCHLS_E2E_PIDFILE, `${browserPid}\n`);
    }
    try {
        for (const scenario of scenarios(python)) {
            if (!only || only.includes(scenario.name)) {
                await runScenario(browser, binary, vsix, scenario, process.env.TORCHLS_E2E_PIDFILE);
            }
        }
    } finally {
        await browser.close();
        fs.rmSync(browserHome, { recursive: true, force: true });
    }
    log(`all scenarios passed; screenshots in ${resultsDir}`);
}

const guard = setTimeout(() => {
    console.error(`e2e: no result after ${OVERALL_TIMEOUT_MS / 1000} s`);
    process.exit(1);
}, OVERALL_TIMEOUT_MS);
guard.unref();

main().then(
    () => process.exit(0),
    (error: unknown) => {
        console.error(error instanceof Error ? (error.stack ?? error.message) : error);
        process.exit(1);
    },
);
