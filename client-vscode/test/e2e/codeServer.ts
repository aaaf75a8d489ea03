/**
 * A throw-away code-server: its own config, user data, extensions and XDG folders under a temp
 * directory (nothing is written to $HOME), the .vsix installed, user settings written, and the
 * server started in its own process group.
 */

import { type ChildProcess, execFile, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as path from "node:path";
import { promisify } from "node:util";
import { stopGroup } from "./processes";

const run = promisify(execFile);

export interface CodeServerOptions {
    readonly binary: string;
    readonly root: string;
    readonly settings: Record<string, unknown>;
    /** false: leave Workspace Trust on, so the folder opens in Restricted Mode. */
    readonly trustEverything: boolean;
    /** Where to append the group id, so the caller's trap can clean up after a hard crash. */
    readonly pidFile?: string;
}

export class CodeServer {
    private child: ChildProcess | undefined;
    readonly url: string;

    private constructor(
        private readonly options: CodeServerOptions,
        readonly port: number,
        readonly logFile: string,
    ) {
        this.url = `http://127.0.0.1:${port}`;
    }

    get root(): string {
        return this.options.root;
    }

    get userDataDir(): string {
        return path.join(this.options.root, "data");
    }

    private baseArgs(): string[] {
        const root = this.options.root;
        return [
            "--config", path.join(root, "config.yaml"),
            "--user-data-dir", this.userDataDir,
            "--extensions-dir", path.join(root, "extensions"),
        ];
    }

    private env(): NodeJS.ProcessEnv {
        const root = this.options.root;
        return { ...process.env, XDG_DATA_HOME: path.join(root, "xdg", "data"), XDG_CONFIG_HOME: path.join(root, "xdg", "config") };
    }

    static async prepare(options: CodeServerOptions): Promise<CodeServer> {
        const port = await freePort();
        fs.mkdirSync(path.join(options.root, "data", "User"), { recursive: true });
        fs.writeFileSync(path.join(options.root, "config.yaml"), `bind-addr: 127.0.0.1:${port}\nauth: none\ncert: false\n`);
        fs.writeFileSync(path.join(options.root, "data", "User", "settings.json"), JSON.stringify(options.settings, null, 2));
        return new CodeServer(options, port, path.join(options.root, "code-server.log"));
    }

    async installExtension(vsix: string): Promise<void> {
        const { stdout, stderr } = await run(this.options.binary, [...this.baseArgs(), "--install-extension", vsix], {
            env: this.env(),
            timeout: 60_000,
        });
        const output = `${stdout}${stderr}`;
        if (!/successfully installed/i.test(output)) {
            throw new Error(`installing ${vsix} failed:\n${output}`);
        }
    }

    async start(folder: string): Promise<void> {
        const log = fs.openSync(this.logFile, "a");
        const flags = ["--disable-telemetry", "--disable-update-check", "--disable-getting-started-override"];
        if (this.options.trustEverything) {
            flags.push("--disable-workspace-trust");
        }
        if (process.env.TORCHLS_E2E_LOG) {
            // e.g. "trace": every log channel, the torchls LSP trace included, goes to disk.
            flags.push("--log", process.env.TORCHLS_E2E_LOG);
        }
        // detached: a new process group, so stop() reaches the extension host and the torchls server.
        this.child = spawn(this.options.binary, [...this.baseArgs(), ...flags, folder], {
            env: this.env(),
            detached: true,
            stdio: ["ignore", log, log],
        });
        fs.closeSync(log);
        if (this.options.pidFile && this.child.pid) {
            fs.appendFileSync(this.options.pidFile, `${this.child.pid}\n`);
        }
        await waitForHealth(`${this.url}/healthz`, 30_000, () => this.child?.exitCode !== null);
    }

    get pgid(): number | undefined {
        return this.child?.pid;
    }

    /** Stops the whole group; returns the PIDs that survived (none, unless something is wrong). */
    async stop(): Promise<number[]> {
        const pgid = this.child?.pid;
        this.child = undefined;
        return pgid ? stopGroup(pgid) : [];
    }

    logTail(lines = 40): string {
        try {
            return fs.readFileSync(this.logFile, "utf8").split("\n").slice(-lines).join("\n");
        } catch {
            return "(no code-server log)";
        }
    }

    /** The extension's own log channel ("torchls"), as VS Code writes it to disk. */
    extensionLog(): string {
        const found: string[] = [];
        const logs = path.join(this.userDataDir, "logs");
        const walk = (dir: string) => {
            for (const entry of fs.existsSync(dir) ? fs.readdirSync(dir, { withFileTypes: true }) : []) {
                const full = path.join(dir, entry.name);
                if (entry.isDirectory()) {
                    walk(full);
                } else if (/torchls/i.test(path.relative(logs, full)) && entry.name.endsWith(".log")) {
                    found.push(full);
                }
            }
        };
        walk(logs);
        return found.map((file) => `== ${file}\n${fs.readFileSync(file, "utf8")}`).join("\n");
    }
}

function freePort(): Promise<number> {
    return new Promise((resolve, reject) => {
        const server = net.createServer();
        server.once("error", reject);
        server.listen(0, "127.0.0.1", () => {
            const address = server.address();
            server.close(() => (typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))));
        });
    });
}

async function waitForHealth(url: string, timeoutMs: number, exited: () => boolean): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
        if (exited()) {
            throw new Error("code-server exited during start-up");
        }
        try {
            const response = await fetch(url);
            if (response.ok) {
                return;
            }
        } catch {
            // Not listening yet.
        }
        await new Promise((resolve) => setTimeout(resolve, 200));
    }
    throw new Error(`code-server did not answer ${url} within ${timeoutMs} ms`);
}
