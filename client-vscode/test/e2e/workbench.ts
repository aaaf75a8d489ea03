/**
 * Driving the VS Code workbench in Debian's chromium with puppeteer-core (no browser download).
 * Selectors are VS Code's own DOM classes; each helper waits for the state it needs instead of
 * sleeping, so a slow machine only makes the test slower.
 */

import * as fs from "node:fs";
import * as path from "node:path";
import puppeteer, { type Browser, type Page } from "puppeteer-core";

export const VIEWPORT = { width: 1400, height: 900 };

/** `home` receives what chromium writes outside its profile (crash reports), instead of $HOME. */
export async function launchBrowser(executablePath: string, home: string): Promise<Browser> {
    if (!fs.existsSync(executablePath)) {
        throw new Error(`chromium not found at ${executablePath} (apt-get install chromium, or set CHROMIUM_BIN)`);
    }
    return puppeteer.launch({
        executablePath,
        headless: true,
        env: { ...process.env, XDG_CONFIG_HOME: path.join(home, "config"), XDG_CACHE_HOME: path.join(home, "cache") },
        defaultViewport: VIEWPORT,
        args: [
            "--no-sandbox", // root in a container: chromium's sandbox needs user namespaces
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-breakpad",
            `--window-size=${VIEWPORT.width},${VIEWPORT.height}`,
        ],
    });
}

export class Workbench {
    constructor(
        readonly page: Page,
        private readonly resultsDir: string,
    ) {}

    static async open(browser: Browser, url: string, folder: string, resultsDir: string): Promise<Workbench> {
        const page = await browser.newPage();
        await page.goto(`${url}/?folder=${encodeURIComponent(folder)}`, { waitUntil: "domcontentloaded" });
        await page.waitForSelector(".monaco-workbench .part.statusbar", { timeout: 60_000 });
        return new Workbench(page, resultsDir);
    }

    async screenshot(name: string): Promise<string> {
        const file = path.join(this.resultsDir, `${name}.png`);
        await this.page.screenshot({ path: file });
        return file;
    }

    /** Runs a command through the palette (F1), as a user would. */
    async runCommand(title: string): Promise<void> {
        await this.page.keyboard.press("F1");
        const input = await this.page.waitForSelector(".quick-input-widget:not([style*='display: none']) input", { timeout: 10_000 });
        await input?.type(`${title}`);
        await this.page.waitForFunction(
            (wanted: string) =>
                [...document.querySelectorAll(".quick-input-list .monaco-list-row")].some((row) => row.textContent?.includes(wanted)),
            { timeout: 10_000 },
            title,
        );
        await this.page.keyboard.press("Enter");
    }

    /** Opens a file of the workspace through Quick Open. */
    async openFile(name: string): Promise<void> {
        await this.runCommand("Go to File");
        const input = await this.page.waitForSelector(".quick-input-widget:not([style*='display: none']) input", { timeout: 10_000 });
        await input?.type(name);
        await this.page.waitForFunction(
            (wanted: string) =>
                [...document.querySelectorAll(".quick-input-list .monaco-list-row")].some((row) => row.textContent?.includes(wanted)),
            { timeout: 10_000 },
            name,
        );
        await this.page.keyboard.press("Enter");
        await this.page.waitForFunction(
            (wanted: string) => document.querySelector(".tabs-container .tab.active")?.textContent?.includes(wanted) ?? false,
            { timeout: 20_000 },
            name,
        );
    }

    async goToLine(line: number): Promise<void> {
        await this.runCommand("Go to Line/Column");
        await this.page.keyboard.type(`${line}`);
        await this.page.keyboard.press("Enter");
    }

    /** Waits for a squiggle in the editor: the server published a diagnostic for the open file. */
    async waitForSquiggle(timeoutMs: number): Promise<void> {
        await this.page.waitForSelector(".monaco-editor .squiggly-error, .monaco-editor .squiggly-warning, .monaco-editor .squiggly-info", {
            timeout: timeoutMs,
        });
    }

    /** Opens the Problems panel and returns the text of its rows once one contains `needle`. */
    async problemsContaining(needle: string, timeoutMs: number): Promise<string[]> {
        await this.runCommand("View: Focus Problems");
        await this.page.waitForFunction(
            (wanted: string) =>
                [...document.querySelectorAll(".markers-panel .monaco-list-row")].some((row) => row.textContent?.includes(wanted)),
            { timeout: timeoutMs },
            needle,
        );
        return this.page.$$eval(".markers-panel .monaco-list-row", (rows) => rows.map((row) => row.textContent ?? ""));
    }

    /** Waits until no Problems row contains `gone` (while one still contains `kept`, if given). */
    async problemsWithout(gone: string, kept: string | undefined, timeoutMs: number): Promise<void> {
        await this.page.waitForFunction(
            (absent: string, present: string | undefined) => {
                const rows = [...document.querySelectorAll(".markers-panel .monaco-list-row")].map((row) => row.textContent ?? "");
                const keptShown = present === undefined || rows.some((text) => text.includes(present));
                return keptShown && !rows.some((text) => text.includes(absent));
            },
            { timeout: timeoutMs },
            gone,
            kept,
        );
    }

    /** The status bar entry contributed by the extension, as its accessible label and text. */
    async statusBarEntry(label: string): Promise<string | undefined> {
        return this.page.evaluate((wanted: string) => {
            const entries = [...document.querySelectorAll(".part.statusbar .statusbar-item")];
            const entry = entries.find((element) => (element.getAttribute("aria-label") ?? element.textContent ?? "").includes(wanted));
            return entry ? `${entry.getAttribute("aria-label") ?? ""} | ${entry.textContent ?? ""}` : undefined;
        }, label);
    }

    /** Waits until the status bar entry whose label contains `label` also contains `state`. */
    async waitForStatusBar(label: string, state: string, timeoutMs: number): Promise<void> {
        await this.page.waitForFunction(
            (wanted: string, expected: string) =>
                [...document.querySelectorAll(".part.statusbar .statusbar-item")]
                    .map((element) => element.getAttribute("aria-label") ?? element.textContent ?? "")
                    .some((text) => text.includes(wanted) && text.includes(expected)),
            { timeout: timeoutMs },
            label,
            state,
        );
    }

    /**
     * Waits for a notification toast whose message contains `needle` (and, if given, that has a
     * button labelled `button`); returns "message [buttons]".
     */
    async notificationContaining(needle: string, timeoutMs: number, button?: string): Promise<string> {
        const handle = await this.page.waitForFunction(
            (wanted: string, label: string | undefined) => {
                for (const toast of document.querySelectorAll(".notifications-toasts .notification-toast")) {
                    const message = toast.querySelector(".notification-list-item-message")?.textContent ?? "";
                    const buttons = [...toast.querySelectorAll(".monaco-button")].map((element) => element.textContent?.trim() ?? "");
                    if (message.includes(wanted) && (label === undefined || buttons.includes(label))) {
                        return `${message} [${buttons.join(" | ")}]`;
                    }
                }
                return false;
            },
            { timeout: timeoutMs },
            needle,
            button,
        );
        // Toasts slide in; wait out the animation so screenshots show them whole.
        await new Promise((resolve) => setTimeout(resolve, 600));
        return String(await handle.jsonValue());
    }

    async clickNotificationButton(label: string): Promise<void> {
        const clicked = await this.page.evaluate((wanted: string) => {
            const buttons = [...document.querySelectorAll<HTMLElement>(".notifications-toasts .monaco-button")];
            const button = buttons.find((element) => element.textContent?.trim() === wanted);
            button?.click();
            return button !== undefined;
        }, label);
        if (!clicked) {
            throw new Error(`no notification button "${label}"`);
        }
    }

    /** Waits for an editor tab whose label contains `title` (a text editor or a webview panel). */
    async waitForTab(title: string, timeoutMs: number): Promise<string> {
        const handle = await this.page.waitForFunction(
            (wanted: string) =>
                [...document.querySelectorAll(".tabs-container .tab")].map((tab) => tab.textContent ?? "").find((text) => text.includes(wanted)) ??
                false,
            { timeout: timeoutMs },
            title,
        );
        return String(await handle.jsonValue());
    }

    /**
     * Waits for a webview whose page text contains `needle`. Webviews are nested iframes (the
     * host frame, then the content frame), so every frame of the page is searched; returns the
     * page's text and the content of its Content-Security-Policy meta elements.
     */
    async webviewContaining(needle: string, timeoutMs: number): Promise<{ text: string; policies: string[] }> {
        const deadline = Date.now() + timeoutMs;
        for (;;) {
            for (const frame of this.page.frames()) {
                if (frame === this.page.mainFrame()) {
                    continue;
                }
                const found = await frame
                    .evaluate(() => ({
                        text: document.body?.innerText ?? "",
                        policies: [...document.querySelectorAll("meta[http-equiv='Content-Security-Policy']")].map(
                            (meta) => meta.getAttribute("content") ?? "",
                        ),
                    }))
                    .catch(() => undefined); // a frame that is navigating or gone
                if (found?.text.includes(needle)) {
                    return found;
                }
            }
            if (Date.now() > deadline) {
                throw new Error(`no webview shows "${needle}" after ${timeoutMs / 1000} s`);
            }
            await new Promise((resolve) => setTimeout(resolve, 500));
        }
    }

    /** Hovers the first squiggle so the diagnostic's hover shows, for the screenshot. */
    async hoverFirstSquiggle(): Promise<boolean> {
        const squiggle = await this.page.$(".monaco-editor .squiggly-error, .monaco-editor .squiggly-warning");
        const box = await squiggle?.boundingBox();
        if (!box) {
            return false;
        }
        await this.page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
        try {
            await this.page.waitForSelector(".monaco-hover:not(.hidden) .hover-contents", { timeout: 5_000 });
            // The hover fades in; a screenshot taken at once catches it half transparent.
            await new Promise((resolve) => setTimeout(resolve, 500));
            return true;
        } catch {
            return false;
        }
    }

    /** Hovers the start of the first error squiggle (the call's name, not an argument inside
     * it) and returns the hover's text ("" when none showed). */
    async hoverErrorSquiggleText(timeoutMs: number): Promise<string> {
        const squiggle = await this.page.waitForSelector(".monaco-editor .squiggly-error", { timeout: timeoutMs }).catch(() => null);
        const box = await squiggle?.boundingBox();
        if (!box) {
            return "";
        }
        await this.page.mouse.move(box.x + Math.min(4, box.width / 2), box.y + box.height / 2);
        try {
            const hover = await this.page.waitForSelector(".monaco-hover:not(.hidden) .hover-contents", { timeout: 5_000 });
            await new Promise((resolve) => setTimeout(resolve, 500));
            const texts = await this.page.$$eval(".monaco-hover:not(.hidden) .hover-contents", (nodes) =>
                nodes.map((node) => (node as HTMLElement).innerText),
            );
            return hover ? texts.join("\n") : "";
        } catch {
            return "";
        }
    }

    /** Clicks the first Problems row containing `needle` (VS Code puts the cursor on the
     * problem: in a notebook, in its cell) and opens the quick fix menu there; its titles. */
    async quickFixMenuAtProblem(needle: string, timeoutMs: number): Promise<string[]> {
        const rows = await this.page.$$(".markers-panel .monaco-list-row");
        for (const row of rows) {
            if ((await row.evaluate((node) => node.textContent ?? "")).includes(needle) && (await row.evaluate((node) => node.querySelector(".marker-message-details, .marker-code") !== null))) {
                await row.click();
                await row.press("Enter");
                break;
            }
        }
        await new Promise((resolve) => setTimeout(resolve, 1_000)); // the cell editor takes focus
        await this.page.keyboard.down("Control");
        await this.page.keyboard.press("Period");
        await this.page.keyboard.up("Control");
        await this.page.waitForSelector(".action-widget .monaco-list-row", { timeout: timeoutMs });
        await new Promise((resolve) => setTimeout(resolve, 500)); // the menu fills in as actions arrive
        return this.page.$$eval(".action-widget .monaco-list-row", (found) =>
            found.map((row) => (row as HTMLElement).innerText.trim()).filter((text) => text.length > 0),
        );
    }

    /** Picks `title` in the open quick fix menu. */
    async chooseQuickFix(title: string): Promise<void> {
        const rows = await this.page.$$(".action-widget .monaco-list-row");
        for (const candidate of rows) {
            if ((await candidate.evaluate((node) => node.textContent ?? "")).includes(title)) {
                await candidate.click();
                return;
            }
        }
        throw new Error(`no quick fix "${title}" in the menu`);
    }
}
