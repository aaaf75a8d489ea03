import { describe, expect, it } from "vitest";
import {
    expandVariables,
    findPythonOnPath,
    type InterpreterInputs,
    interpreterFromSetting,
    resolveInterpreter,
} from "../../src/interpreter";

function inputs(overrides: Partial<InterpreterInputs> = {}): InterpreterInputs {
    return {
        setting: [],
        workspaceFolder: "/work/project",
        userHome: "/home/ada",
        env: { PATH: "/usr/local/bin:/usr/bin" },
        platform: "linux",
        isExecutable: (file) => file === "/usr/bin/python3",
        ...overrides,
    };
}

describe("expandVariables", () => {
    const context = { workspaceFolder: "/work/project", userHome: "/home/ada", env: { VENV: "/opt/venv" } };

    it("expands workspaceFolder, userHome, env and a leading tilde", () => {
        expect(expandVariables("${workspaceFolder}/.venv/bin/python", context)).toBe("/work/project/.venv/bin/python");
        expect(expandVariables("${userHome}/py/bin/python", context)).toBe("/home/ada/py/bin/python");
        expect(expandVariables("${env:VENV}/bin/python", context)).toBe("/opt/venv/bin/python");
        expect(expandVariables("~/envs/t/bin/python", context)).toBe("/home/ada/envs/t/bin/python");
    });

    it("keeps ${workspaceFolder} when no folder is open, so the error shows what was missing", () => {
        expect(expandVariables("${workspaceFolder}/python", { ...context, workspaceFolder: undefined })).toBe("${workspaceFolder}/python");
    });

    it("expands an unset environment variable to nothing and leaves a tilde inside a path", () => {
        expect(expandVariables("${env:NOPE}/x", context)).toBe("/x");
        expect(expandVariables("/a/~b", context)).toBe("/a/~b");
    });
});

describe("interpreterFromSetting", () => {
    const context = { workspaceFolder: "/work/project", userHome: "/home/ada", env: {} };

    it("treats an empty or blank setting as unset", () => {
        expect(interpreterFromSetting([], context)).toBeUndefined();
        expect(interpreterFromSetting(["  "], context)).toBeUndefined();
    });

    it("anchors relative paths at the workspace folder but leaves bare names for PATH", () => {
        expect(interpreterFromSetting([".venv/bin/python"], context)).toEqual({ command: "/work/project/.venv/bin/python", args: [] });
        expect(interpreterFromSetting(["python3.12"], context)).toEqual({ command: "python3.12", args: [] });
    });

    it("keeps the interpreter's own arguments", () => {
        expect(interpreterFromSetting(["/usr/bin/python3", "-X", "utf8"], context)).toEqual({ command: "/usr/bin/python3", args: ["-X", "utf8"] });
    });
});

describe("findPythonOnPath", () => {
    it("prefers python3 over python, in PATH order", () => {
        const found = findPythonOnPath({
            env: { PATH: "/a:/b" },
            platform: "linux",
            isExecutable: (file) => file === "/a/python" || file === "/b/python3",
        });
        expect(found).toBe("/b/python3");
    });

    it("uses ; and python.exe on Windows", () => {
        const found = findPythonOnPath({
            env: { Path: "C:\\Py;C:\\Other" },
            platform: "win32",
            isExecutable: (file) => file === "C:\\Other\\python.exe",
        });
        expect(found).toBe("C:\\Other\\python.exe");
    });

    it("returns undefined when nothing is found or PATH is unset", () => {
        expect(findPythonOnPath({ env: {}, platform: "linux", isExecutable: () => true })).toBeUndefined();
    });
});

describe("resolveInterpreter", () => {
    it("uses the setting first, without asking the Python extension", async () => {
        let asked = false;
        const resolved = await resolveInterpreter(
            inputs({
                setting: ["${workspaceFolder}/.venv/bin/python"],
                pythonExtension: async () => {
                    asked = true;
                    return ["/conda/bin/python"];
                },
            }),
        );
        expect(resolved).toEqual({ command: "/work/project/.venv/bin/python", args: [], source: "setting" });
        expect(asked).toBe(false);
    });

    it("uses the Python extension's environment when the setting is empty", async () => {
        const resolved = await resolveInterpreter(inputs({ pythonExtension: async () => ["/conda/bin/python"] }));
        expect(resolved).toEqual({ command: "/conda/bin/python", args: [], source: "pythonExtension" });
    });

    it("falls back to PATH when the Python extension has no environment or fails", async () => {
        const none = await resolveInterpreter(inputs({ pythonExtension: async () => undefined }));
        expect(none).toEqual({ command: "/usr/bin/python3", args: [], source: "path" });
        const failing = await resolveInterpreter(
            inputs({
                pythonExtension: async () => {
                    throw new Error("not activated");
                },
            }),
        );
        expect(failing?.source).toBe("path");
    });

    it("falls back to PATH without the Python extension and gives up when PATH has no Python", async () => {
        expect((await resolveInterpreter(inputs()))?.source).toBe("path");
        expect(await resolveInterpreter(inputs({ isExecutable: () => false }))).toBeUndefined();
    });
});
