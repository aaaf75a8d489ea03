#!/usr/bin/env bash
# The VS Code extension suite, from a clean clone: npm ci, typecheck, unit tests, the .vsix
# (`npm run package`), code-server 4.100.3 installed into a cache outside the repository
# (client-vscode/scripts/install-code-server.sh), then the end-to-end test in code-server driven
# through Debian's chromium (`npm run test:e2e`). Needs node 20, the packages in
# scripts/apt.d/vscode.txt, and the npm/PyPI registries; runs as root or not.
#
# Every step runs in its own process group (setsid), and the e2e test records the groups it
# starts (code-server, chromium); whatever is still alive when this script exits is killed by group.
set -euo pipefail
started=$(date +%s)
root="$(cd "$(dirname "$0")/../.." && pwd)"
client="$root/client-vscode"

venv="${TORCHLS_VENV:-$root/.venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
if [ ! -x "$venv/bin/python" ]; then
    echo "vscode.sh: TORCHLS_VENV ($venv) has no bin/python; run scripts/test" >&2
    exit 1
fi
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" != 20 ]; then
    # code-server 4.100.3 (the e2e's VS Code) is the last release for node 20, and vsce 3.x is pinned for it.
    echo "vscode.sh: node 20 is required, found $(node --version)" >&2
    exit 1
fi

groups_file="$(mktemp)"
# A group counts as alive while it has a process that is not a zombie (PID 1 here may be slow
# to reap the ones whose parent already exited, such as esbuild's service under vitest).
group_alive() { ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'; }
stop_group() {
    group_alive "$1" || return 0
    kill -TERM -- "-$1" 2>/dev/null || true
    for _ in $(seq 50); do group_alive "$1" || return 0; sleep 0.1; done
    kill -KILL -- "-$1" 2>/dev/null || true
}
cleanup() {
    local pgid
    while read -r pgid; do
        [ -n "$pgid" ] && stop_group "$pgid"
    done < "$groups_file"
    rm -f "$groups_file"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Runs "$@" as the leader of a new process group, waits, and stops anything it left behind.
in_group() {
    # In a non-interactive shell a background job shares our group, so setsid does not fork:
    # $! is the new group's leader and its id is the group id.
    setsid "$@" < /dev/null &
    local pgid=$!
    echo "$pgid" >> "$groups_file"
    local status=0
    wait "$pgid" || status=$?
    if group_alive "$pgid"; then
        echo "vscode.sh: '$*' left processes behind; stopping them" >&2
        stop_group "$pgid"
    fi
    return "$status"
}

step() { echo "-- vscode: $* ($(( $(date +%s) - started )) s)"; }

cd "$client"
step "npm ci"
in_group npm ci --no-audit --no-fund --loglevel=error
step "unit tests"
TORCHLS_VENV="$venv" in_group npm test --silent
step "npm run package"
package_log="$(mktemp)"
TORCHLS_BUNDLE_PYTHON="$venv/bin/python" in_group npm run --silent package > "$package_log" 2>&1 || {
    tail -40 "$package_log" >&2
    rm -f "$package_log"
    exit 1
}
grep "Packaged" "$package_log" || true
rm -f "$package_log"
step "code-server"
code_server="$(in_group bash scripts/install-code-server.sh)"
step "end-to-end test"
TORCHLS_VENV="$venv" CODE_SERVER_BIN="$code_server" TORCHLS_E2E_PIDFILE="$groups_file" \
    in_group npm run --silent test:e2e
step "done in $(( $(date +%s) - started )) s"
