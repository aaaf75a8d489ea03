import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { checkInterpreter, parseCheckOutput } from "../../src/serverCheck";

describe("parseCheckOutput", () => {
    it("recognises a working interpreter", () => {
        const result = parseCheckOutput({ exitCode: 0, stdout: "python=3.11.7\ntorchls=0.1.0\nlocation=/x/torchls/__init__.py\n", stderr: "" });
        expect(result).toEqual({ kind: "ok", python: "3.11.7", torchls: "0.1.0", location: "/x/torchls/__init__.py" });
    });

    it("recognises a missing torchls", () => {
        const result = parseCheckOutput({ exitCode: 4, stdout: "python=3.12.1\nerror=ModuleNotFoundError: No module named 'torchls'\n", stderr: "" });
        expect(result).toEqual({ kind: "torchlsMissing", python: "3.12.1", detail: "ModuleNotFoundError: No module named 'torchls'" });
    });

    it("recognises a Python that is too old", () => {
        expect(parseCheckOutput({ exitCode: 3, stdout: "python=3.8.10\n", stderr: "" })).toEqual({ kind: "pythonTooOld", python: "3.8.10" });
    });

    it("recognises something that is not a Python", () => {
        expect(parseCheckOutput({ exitCode: null, stdout: "", stderr: "", spawnError: "ENOENT: spawn nope" }).kind).toBe("notRunnable");
        expect(parseCheckOutput({ exitCode: 2, stdout: "", stderr: "Unknown option: -c" })).toEqual({ kind: "notRunnable", detail: "Unknown option: -c" });
    });
});

describe("checkInterpreter", () => {
    it("reports an executable that does not exist", async () => {
        const result = await checkInterpreter("/nonexistent/python3", [], { cwd: process.cwd(), env: process.env });
        expect(result.kind).toBe("notRunnable");
    });

    const venv = process.env.TORCHLS_VENV;
    it.runIf(venv)("finds torchls in $TORCHLS_VENV", async () => {
        const result = await checkInterpreter(path.join(venv ?? "", "bin", "python"), [], { cwd: process.cwd(), env: process.env });
        expect(result.kind).toBe("ok");
    });
});
