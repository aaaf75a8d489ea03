import { describe, expect, it } from "vitest";
import { launchPlan, serverEnvironment } from "../../src/launch";

describe("launch", () => {
    it("runs `python -m torchls server` from the extension folder", () => {
        const plan = launchPlan({ command: "/venv/bin/python", args: ["-X", "utf8"] }, undefined, "/ext", { PATH: "/usr/bin" });
        expect(plan.command).toBe("/venv/bin/python");
        expect(plan.args).toEqual(["-X", "utf8", "-m", "torchls", "server"]);
        expect(plan.cwd).toBe("/ext");
        expect(plan.env.PYTHONPATH).toBeUndefined();
    });

    it("puts the bundled libraries first on PYTHONPATH for useBundled", () => {
        expect(serverEnvironment({}, "/store/libs", ":").PYTHONPATH).toBe("/store/libs");
        expect(serverEnvironment({ PYTHONPATH: "/mine" }, "/store/libs", ":").PYTHONPATH).toBe("/store/libs:/mine");
        expect(serverEnvironment({ PYTHONPATH: "/mine" }, undefined, ":").PYTHONPATH).toBe("/mine");
    });
});
