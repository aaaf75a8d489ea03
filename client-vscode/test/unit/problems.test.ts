import { describe, expect, it } from "vitest";
import { actionsFor, messageFor } from "../../src/problems";
import { reproArguments } from "../../src/reproArguments";
import { DEFAULT_SETTINGS } from "../../src/settings";

describe("problems", () => {
    const interpreter = { command: "/usr/bin/python3", args: [], source: "path" as const };

    it("offers install, select and the bundled copy when torchls is missing", () => {
        const problem = { kind: "torchlsMissing" as const, interpreter, detail: "No module named 'torchls'" };
        expect(messageFor(problem)).toContain("torchls is not installed in /usr/bin/python3");
        expect(actionsFor(problem, DEFAULT_SETTINGS, true)).toEqual(["Select Interpreter", "Install torchls", "Use Bundled"]);
        expect(actionsFor(problem, DEFAULT_SETTINGS, false)).not.toContain("Use Bundled");
        expect(actionsFor(problem, { ...DEFAULT_SETTINGS, importStrategy: "useBundled" }, true)).not.toContain("Use Bundled");
    });

    it("offers only a new interpreter when there is none or it cannot run", () => {
        expect(actionsFor({ kind: "noInterpreter" }, DEFAULT_SETTINGS, true)).toEqual(["Select Interpreter", "Show Log"]);
    });
});

describe("reproArguments", () => {
    it("forwards a caller's arguments unchanged", () => {
        expect(reproArguments([{ uri: "file:///a.py", steps: 1 }], undefined)).toEqual([{ uri: "file:///a.py", steps: 1 }]);
    });

    it("uses the active Python document from the palette, and nothing otherwise", () => {
        expect(reproArguments([], { uri: "file:///t.py", languageId: "python" })).toEqual([{ uri: "file:///t.py" }]);
        expect(reproArguments([], { uri: "file:///r.md", languageId: "markdown" })).toBeUndefined();
        expect(reproArguments([], undefined)).toBeUndefined();
    });
});
