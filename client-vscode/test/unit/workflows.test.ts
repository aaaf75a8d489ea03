import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import {
    CHECKPOINT_FILTERS,
    COMPARE_REPRO,
    INSPECT_CHECKPOINT,
    REPORT_CSP,
    reproHasReport,
    reproSummary,
    SHOW_REPORT_ACTION,
    SHOW_REPRO_REPORT,
    uriName,
    type WebviewSpec,
    withContentSecurityPolicy,
    type WorkflowHost,
    Workflows,
} from "../../src/workflows";

const SCRIPT = "file:///work/train%20one.py";
const REPORT_HTML =
    '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n<title>torchls repro</title></head><body><h1>torchls repro</h1></body></html>';

interface Calls {
    requests: { command: string; args: unknown[] }[];
    webviews: WebviewSpec[];
    markdown: { name: string; markdown: string }[];
    infos: { message: string; actions: string[] }[];
    errors: string[];
    refusals: string[];
    commands: { command: string; args: unknown[] }[];
    picks: { title: string; filters: Readonly<Record<string, readonly string[]>> }[];
    saves: number;
}

function fakeHost(options: {
    trusted?: boolean;
    active?: { uri: string; dirty?: boolean } | null;
    answer?: (command: string, args: unknown[]) => unknown;
    offers?: readonly string[];
    picked?: string;
    clicks?: string;
}): { host: WorkflowHost; calls: Calls } {
    const calls: Calls = { requests: [], webviews: [], markdown: [], infos: [], errors: [], refusals: [], commands: [], picks: [], saves: 0 };
    const active = options.active === undefined ? { uri: SCRIPT } : options.active;
    const host: WorkflowHost = {
        isTrusted: () => options.trusted ?? true,
        refuseUntrusted: async (message) => {
            calls.refusals.push(message);
        },
        activePythonDocument: () =>
            active
                ? {
                      uri: active.uri,
                      name: uriName(active.uri),
                      isDirty: active.dirty ?? false,
                      save: async () => {
                          calls.saves += 1;
                      },
                  }
                : undefined,
        serverOffers: (command) => (options.offers ?? [SHOW_REPRO_REPORT]).includes(command),
        request: async (command, args) => {
            calls.requests.push({ command, args });
            return options.answer?.(command, args);
        },
        showWebview: (spec) => calls.webviews.push(spec),
        showMarkdown: async (name, markdown) => {
            calls.markdown.push({ name, markdown });
        },
        pickFile: async (title, filters) => {
            calls.picks.push({ title, filters });
            return options.picked;
        },
        info: async (message, ...actions) => {
            calls.infos.push({ message, actions });
            return options.clicks;
        },
        error: (message) => calls.errors.push(message),
        runCommand: async (command, ...args) => {
            calls.commands.push({ command, args });
            return undefined;
        },
    };
    return { host, calls };
}

describe("withContentSecurityPolicy", () => {
    it("puts the webview's policy first in the head, before anything the page says", () => {
        const html = withContentSecurityPolicy(REPORT_HTML);
        const meta = `<meta http-equiv="Content-Security-Policy" content="${REPORT_CSP}">`;
        expect(REPORT_CSP).toBe("default-src 'none'; style-src 'unsafe-inline'; img-src data:");
        expect(html.indexOf(meta)).toBeGreaterThan(html.indexOf("<head>"));
        expect(html.indexOf(meta)).toBeLessThan(html.indexOf('<meta charset="utf-8">'));
        expect(html.replace(`\n${meta}`, "")).toBe(REPORT_HTML);
    });

    it("adds the policy to a page without a head, after its doctype", () => {
        expect(withContentSecurityPolicy("<!DOCTYPE html><p>x</p>", "default-src 'none'")).toBe(
            `<!DOCTYPE html><meta http-equiv="Content-Security-Policy" content="default-src 'none'"><p>x</p>`,
        );
        expect(withContentSecurityPolicy("<p>x</p>", "a")).toBe(`<meta http-equiv="Content-Security-Policy" content="a"><p>x</p>`);
    });

    it("keeps a quote in the policy from closing the attribute", () => {
        expect(withContentSecurityPolicy("<head></head>", 'a"b')).toContain('content="a&quot;b"');
    });
});

describe("torchls.showReproReport", () => {
    it("asks the server for the active document's report and shows it in a webview without scripts", async () => {
        const { host, calls } = fakeHost({ answer: () => ({ path: "/tmp/report.html", html: REPORT_HTML }) });
        await new Workflows(host).showReproReport();
        expect(calls.requests).toEqual([{ command: SHOW_REPRO_REPORT, args: [SCRIPT] }]);
        expect(calls.webviews).toHaveLength(1);
        const [spec] = calls.webviews;
        expect(spec?.title).toBe("Repro Report: train one.py");
        expect(spec?.options).toEqual({ enableScripts: false, enableForms: false, localResourceRoots: [] });
        expect(spec?.html).toBe(withContentSecurityPolicy(REPORT_HTML));
        expect(spec?.html).toContain(`content="${REPORT_CSP}"`);
    });

    it("uses the document it is given (the repro's notice) over the active one", async () => {
        const { host, calls } = fakeHost({ answer: () => ({ path: "", html: REPORT_HTML }) });
        await new Workflows(host).showReproReport("file:///other.py");
        expect(calls.requests[0]?.args).toEqual(["file:///other.py"]);
    });

    it("is allowed in Restricted Mode: it runs nothing", async () => {
        const { host, calls } = fakeHost({ trusted: false, answer: () => ({ path: "", html: REPORT_HTML }) });
        await new Workflows(host).showReproReport();
        expect(calls.refusals).toEqual([]);
        expect(calls.webviews).toHaveLength(1);
    });

    it("says so when the server has no report, and opens nothing", async () => {
        const { host, calls } = fakeHost({
            answer: () => {
                throw new Error("no repro of train one.py yet");
            },
        });
        await new Workflows(host).showReproReport();
        expect(calls.errors).toEqual(["torchls: no repro report to show: no repro of train one.py yet"]);
        expect(calls.webviews).toEqual([]);
    });

    it("sends nothing without a Python document, and shows nothing for a malformed answer", async () => {
        const none = fakeHost({ active: null });
        await new Workflows(none.host).showReproReport();
        expect(none.calls.requests).toEqual([]);
        expect(none.calls.infos).toHaveLength(1);
        const malformed = fakeHost({ answer: () => ({ path: "/tmp/r.html" }) });
        await new Workflows(malformed.host).showReproReport();
        expect(malformed.calls.webviews).toEqual([]);
        expect(malformed.calls.errors).toHaveLength(1);
    });
});

describe("torchls.inspectCheckpoint", () => {
    const answer = () => ({ status: "blocked", markdown: "# ckpt.pt\nblocked by argparse.Namespace", loads: false });

    it("asks for a checkpoint file and sends its path", async () => {
        const { host, calls } = fakeHost({ picked: "/work/ckpt.pt", answer });
        const result = await new Workflows(host).inspectCheckpoint();
        expect(calls.picks).toEqual([{ title: "Inspect Checkpoint", filters: CHECKPOINT_FILTERS }]);
        expect(CHECKPOINT_FILTERS).toEqual({ Checkpoints: ["pt", "pth", "ckpt", "bin", "safetensors"] });
        expect(calls.requests).toEqual([{ command: INSPECT_CHECKPOINT, args: ["/work/ckpt.pt"] }]);
        expect(calls.markdown).toEqual([{ name: "ckpt.pt.md", markdown: "# ckpt.pt\nblocked by argparse.Namespace" }]);
        expect(result).toEqual({ status: "blocked", markdown: "# ckpt.pt\nblocked by argparse.Namespace", loads: false });
    });

    it("inspects a file given by the caller (the Explorer menu) without asking", async () => {
        const { host, calls } = fakeHost({ answer });
        await new Workflows(host).inspectCheckpoint("/work/model.safetensors");
        expect(calls.picks).toEqual([]);
        expect(calls.requests[0]?.args).toEqual(["/work/model.safetensors"]);
    });

    it("does nothing when the dialog is cancelled", async () => {
        const { host, calls } = fakeHost({ answer });
        await new Workflows(host).inspectCheckpoint();
        expect(calls.requests).toEqual([]);
    });

    it("refuses in Restricted Mode before asking or sending anything", async () => {
        const { host, calls } = fakeHost({ trusted: false, picked: "/work/ckpt.pt", answer });
        await new Workflows(host).inspectCheckpoint();
        expect(calls.refusals).toHaveLength(1);
        expect(calls.refusals[0]).toContain("Restricted Mode");
        expect(calls.picks).toEqual([]);
        expect(calls.requests).toEqual([]);
    });
});

describe("torchls.compareRepro", () => {
    const answer = () => ({ status: "fixed", exit_status: 0, markdown: "| | HEAD | now |" });

    it("compares the active document with HEAD, saving it first", async () => {
        const { host, calls } = fakeHost({ active: { uri: SCRIPT, dirty: true }, answer });
        const result = await new Workflows(host).compareWithHead();
        expect(calls.saves).toBe(1);
        expect(calls.requests).toEqual([{ command: COMPARE_REPRO, args: [SCRIPT, "HEAD"] }]);
        expect(calls.markdown).toEqual([{ name: "train one.py vs HEAD.md", markdown: "| | HEAD | now |" }]);
        expect(result).toEqual({ status: "fixed", exitStatus: 0, markdown: "| | HEAD | now |" });
    });

    it("takes the document and baseline of the server's code action", async () => {
        const { host, calls } = fakeHost({ active: null, answer });
        await new Workflows(host).compareWithHead("file:///p/t.py", "HEAD~3");
        expect(calls.requests).toEqual([{ command: COMPARE_REPRO, args: ["file:///p/t.py", "HEAD~3"] }]);
        expect(calls.markdown[0]?.name).toBe("t.py vs HEAD~3.md");
    });

    it("refuses in Restricted Mode without sending anything", async () => {
        const { host, calls } = fakeHost({ trusted: false, answer });
        await new Workflows(host).compareWithHead();
        expect(calls.refusals).toHaveLength(1);
        expect(calls.requests).toEqual([]);
    });

    it("reports the server's error instead of showing a page", async () => {
        const { host, calls } = fakeHost({
            answer: () => {
                throw new Error("not a git repository");
            },
        });
        await new Workflows(host).compareWithHead();
        expect(calls.errors).toEqual(["torchls: the comparison with HEAD failed: not a git repository"]);
        expect(calls.markdown).toEqual([]);
    });
});

describe("the repro's Show Report notice", () => {
    const finished = { status: "ok", message: "train one.py: 2 steps, no findings", findings: [] };

    it("offers Show Report after a finished run, and opens that document's report", async () => {
        const { host, calls } = fakeHost({ clicks: SHOW_REPORT_ACTION });
        await new Workflows(host).afterRepro([{ uri: SCRIPT }], finished);
        expect(calls.infos).toEqual([{ message: "torchls: train one.py: 2 steps, no findings", actions: [SHOW_REPORT_ACTION] }]);
        expect(calls.commands).toEqual([{ command: SHOW_REPRO_REPORT, args: [SCRIPT] }]);
    });

    it("leaves out the server's pointer to the command, which the button replaces", async () => {
        const { host, calls } = fakeHost({});
        await new Workflows(host).afterRepro([{ uri: SCRIPT }], { status: "ok", message: "2 steps, no findings. Its HTML report: torchls.showReproReport." });
        expect(calls.infos[0]?.message).toBe("torchls: 2 steps, no findings");
        expect(reproSummary("")).toBeUndefined();
        expect(reproSummary("TL901 on line 3")).toBe("TL901 on line 3");
    });

    it("opens nothing when the notice is dismissed", async () => {
        const { host, calls } = fakeHost({});
        await new Workflows(host).afterRepro([{ uri: SCRIPT }], finished);
        expect(calls.infos).toHaveLength(1);
        expect(calls.commands).toEqual([]);
    });

    it("stays quiet for runs without a report, and for servers without the command", async () => {
        for (const result of [undefined, { status: "failed", message: "x" }, { status: "cancelled" }, { status: "started" }]) {
            const { host, calls } = fakeHost({});
            await new Workflows(host).afterRepro([{ uri: SCRIPT }], result);
            expect(calls.infos).toEqual([]);
        }
        const old = fakeHost({ offers: [] });
        await new Workflows(old.host).afterRepro([{ uri: SCRIPT }], finished);
        expect(old.calls.infos).toEqual([]);
        expect(reproHasReport({ status: "nonfinite" })).toBe(true);
    });
});

describe("package.json", () => {
    const manifest = JSON.parse(fs.readFileSync(path.resolve(__dirname, "..", "..", "package.json"), "utf8")) as {
        contributes: { commands: { command: string; title: string; category: string }[]; menus: Record<string, { command: string; when?: string }[]> };
    };

    it("contributes the three commands under the torchls category", () => {
        const titles = Object.fromEntries(manifest.contributes.commands.map((entry) => [entry.command, `${entry.category}: ${entry.title}`]));
        expect(titles[SHOW_REPRO_REPORT]).toBe("torchls: Show Repro Report");
        expect(titles[INSPECT_CHECKPOINT]).toBe("torchls: Inspect Checkpoint…");
        expect(titles[COMPARE_REPRO]).toBe("torchls: Compare with HEAD");
    });

    it("offers Inspect Checkpoint on checkpoint files in the Explorer", () => {
        const entry = manifest.contributes.menus["explorer/context"]?.find((item) => item.command === INSPECT_CHECKPOINT);
        const pattern = /resourceExtname =~ \/(.*)\/$/.exec(entry?.when ?? "")?.[1] ?? "^$";
        for (const extension of CHECKPOINT_FILTERS.Checkpoints ?? []) {
            expect(new RegExp(pattern).test(`.${extension}`)).toBe(true);
        }
        expect(new RegExp(pattern).test(".py")).toBe(false);
    });
});
