import { describe, expect, it } from "vitest";
import {
    type ConfigReader,
    DEFAULT_SETTINGS,
    initializationOptions,
    needsRestart,
    readSettings,
    serverSettings,
} from "../../src/settings";

function reader(values: Record<string, unknown>): ConfigReader {
    return { get: (key) => values[key] };
}

describe("readSettings", () => {
    it("gives the defaults when nothing is set", () => {
        expect(readSettings(reader({}))).toEqual(DEFAULT_SETTINGS);
    });

    it("reads every setting", () => {
        const settings = readSettings(
            reader({
                enable: false,
                select: ["TL1"],
                ignore: ["TL302"],
                run: "onSave",
                interpreter: ["/venv/bin/python", "-X", "utf8"],
                importStrategy: "useBundled",
                "probe.device": "cuda:1",
                "probe.steps": 3,
                "probe.timeout": 12.5,
                "probe.memory": 2048,
                "probe.python": "/torch/bin/python",
                "probe.args": " --epochs 1 --fast ",
                "probe.cwd": "data",
                "probe.writable": ["runs", 3, ""],
                "probe.network": "yes",
                "probe.nproc": 2,
                "probe.sandbox": " none ",
            }),
        );
        expect(settings).toEqual({
            enable: false,
            select: ["TL1"],
            ignore: ["TL302"],
            run: "onSave",
            interpreter: ["/venv/bin/python", "-X", "utf8"],
            importStrategy: "useBundled",
            probe: {
                device: "cuda:1",
                steps: 3,
                timeout: 12.5,
                memory: 2048,
                python: "/torch/bin/python",
                args: "--epochs 1 --fast",
                spec: "",
                cwd: "data",
                writable: ["runs"],
                // Only `true` opens the network: a string of the wrong type must not.
                network: false,
                nproc: 2,
                sandbox: "none",
            },
        });
    });

    it("keeps select null (pyproject decides) apart from an explicit list", () => {
        expect(readSettings(reader({ select: null })).select).toBeNull();
        expect(readSettings(reader({ select: [] })).select).toEqual([]);
        expect(readSettings(reader({ select: "TL1, TL203" })).select).toEqual(["TL1", "TL203"]);
    });

    it("falls back to defaults on values of the wrong type", () => {
        const settings = readSettings(
            reader({ enable: "yes", select: 3, ignore: [1], run: "sometimes", importStrategy: "x", "probe.steps": -1, "probe.memory": "big" }),
        );
        expect(settings.enable).toBe(true);
        expect(settings.select).toBeNull();
        expect(settings.ignore).toEqual([]);
        expect(settings.run).toBe("onType");
        expect(settings.importStrategy).toBe("fromEnvironment");
        expect(settings.probe.steps).toBe(DEFAULT_SETTINGS.probe.steps);
        expect(settings.probe.memory).toBe(DEFAULT_SETTINGS.probe.memory);
    });

    it("forwards a misspelt sandbox for the server to reject, and a blank one as auto", () => {
        expect(readSettings(reader({ "probe.sandbox": "off" })).probe.sandbox).toBe("off");
        expect(readSettings(reader({ "probe.sandbox": "" })).probe.sandbox).toBe("auto");
        expect(readSettings(reader({ "probe.sandbox": false })).probe.sandbox).toBe("auto");
    });

    it("accepts run in any case and a plain-string interpreter with spaces", () => {
        expect(readSettings(reader({ run: "ONSAVE" })).run).toBe("onSave");
        expect(readSettings(reader({ interpreter: "/opt/my python/bin/python" })).interpreter).toEqual(["/opt/my python/bin/python"]);
        expect(readSettings(reader({ interpreter: "" })).interpreter).toEqual([]);
    });
});

describe("serverSettings", () => {
    it("sends only what the server reads, with probe.python defaulting to the server's interpreter", () => {
        const settings = readSettings(reader({ interpreter: ["/venv/bin/python"], ignore: ["TL2"] }));
        const server = serverSettings(settings, "/venv/bin/python");
        expect(server).toEqual({
            enable: true,
            select: null,
            ignore: ["TL2"],
            run: "onType",
            probe: { ...DEFAULT_SETTINGS.probe, python: "/venv/bin/python" },
        });
        expect(Object.keys(server)).not.toContain("interpreter");
    });

    it("expands an explicit probe.python", () => {
        const settings = readSettings(reader({ "probe.python": "${workspaceFolder}/torch/bin/python" }));
        const server = serverSettings(settings, "/venv/bin/python", (value) => value.replace("${workspaceFolder}", "/p"));
        expect(server.probe.python).toBe("/p/torch/bin/python");
    });

    it("wraps settings and trust the way the server splits initializationOptions", () => {
        const server = serverSettings(DEFAULT_SETTINGS, undefined);
        expect(initializationOptions(server, false)).toEqual({ settings: server, trusted: false, webviewReports: true });
    });
});

describe("needsRestart", () => {
    it("restarts for interpreter and importStrategy only", () => {
        expect(needsRestart((section) => section === "torchls.interpreter")).toBe(true);
        expect(needsRestart((section) => section === "torchls.importStrategy")).toBe(true);
        expect(needsRestart((section) => section === "torchls.select" || section === "torchls")).toBe(false);
    });
});
