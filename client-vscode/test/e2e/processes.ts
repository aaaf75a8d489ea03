/**
 * Process-group helpers: code-server forks an extension host, which forks the torchls server;
 * killing only the main PID would leave those behind, so each server runs in its own group
 * and the whole group is stopped and checked.
 */

import * as fs from "node:fs";

/** PIDs whose process group is `pgid` (Linux /proc; empty elsewhere). */
export function processesInGroup(pgid: number): number[] {
    const found: number[] = [];
    let entries: string[] = [];
    try {
        entries = fs.readdirSync("/proc").filter((name) => /^\d+$/.test(name));
    } catch {
        return found;
    }
    for (const pid of entries) {
        try {
            const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
            // Fields after the parenthesised command name: state ppid pgrp ...
            const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
            if (Number(fields[2]) === pgid && fields[0] !== "Z") {
                found.push(Number(pid));
            }
        } catch {
            // The process ended while we looked.
        }
    }
    return found;
}

export function commandLine(pid: number): string {
    try {
        return fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ").trim();
    } catch {
        return "";
    }
}

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
    try {
        process.kill(-pgid, signal);
    } catch {
        // ESRCH: the group is already gone.
    }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** SIGTERM the group, then SIGKILL whatever is left after `graceMs`. Returns survivors (should be none). */
export async function stopGroup(pgid: number, graceMs = 5000): Promise<number[]> {
    signalGroup(pgid, "SIGTERM");
    const deadline = Date.now() + graceMs;
    while (Date.now() < deadline && processesInGroup(pgid).length > 0) {
        await sleep(100);
    }
    if (processesInGroup(pgid).length > 0) {
        signalGroup(pgid, "SIGKILL");
        await sleep(300);
    }
    return processesInGroup(pgid);
}
