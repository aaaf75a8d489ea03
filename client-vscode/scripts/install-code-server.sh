#!/usr/bin/env bash
# Installs code-server from npm into a cache folder outside the repository, for the e2e test.
#
# Why the flags (measured, see ../shared/research/environment.md §6): 4.100.3 is the last
# code-server release for node 20; as root its postinstall wants --unsafe-perm; its native
# modules need libkrb5-dev, libxkbfile-dev and libsecret-1-dev (scripts/apt.d/vscode.txt);
# @vscode/ripgrep downloads rg from GitHub, which is unreachable here, so we seed the cache its
# download script checks first (under $TMPDIR) with Debian's rg; node-pty's postinstall runs
# `npx node-gyp`, which a `yes=false` npm config refuses, hence npm_config_yes=true.
#
# Prints the code-server executable on stdout; everything else goes to stderr.
set -euo pipefail

version="${CODE_SERVER_VERSION:-4.100.3}"
ripgrep_package_version="1.15.11"   # the @vscode/ripgrep that code-server 4.100.3 pins
ripgrep_asset="ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz"

cache="${TORCHLS_VSCODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/torchls-vscode}"
prefix="$cache/code-server-$version"
bin="$prefix/node_modules/.bin/code-server"

if [ -f "$prefix/.complete" ] && [ -x "$bin" ]; then
    echo "$bin"
    exit 0
fi

rg_path="$(command -v rg || true)"
if [ -z "$rg_path" ]; then
    echo "install-code-server: ripgrep (rg) is needed; install the packages in scripts/apt.d/vscode.txt" >&2
    exit 1
fi

rm -rf "$prefix"
mkdir -p "$prefix/tmp/vscode-ripgrep-cache-$ripgrep_package_version" "$prefix/tmp/rg"
cp "$rg_path" "$prefix/tmp/rg/rg"
tar czf "$prefix/tmp/vscode-ripgrep-cache-$ripgrep_package_version/$ripgrep_asset" -C "$prefix/tmp/rg" rg

cd "$prefix"
printf '{ "name": "torchls-e2e-code-server", "private": true }\n' > package.json
echo "install-code-server: installing code-server@$version into $prefix" >&2
TMPDIR="$prefix/tmp" npm_config_yes=true npm install "code-server@$version" \
    --unsafe-perm=true --foreground-scripts --no-audit --no-fund --loglevel=error >"$prefix/install.log" 2>&1 || {
    tail -40 "$prefix/install.log" >&2
    exit 1
}
# --version with throw-away config and data folders, so nothing is written under $HOME.
printf 'bind-addr: 127.0.0.1:0\nauth: none\ncert: false\n' > "$prefix/tmp/config.yaml"
XDG_DATA_HOME="$prefix/tmp" XDG_CONFIG_HOME="$prefix/tmp" \
    "$bin" --config "$prefix/tmp/config.yaml" --version >&2
rm -rf "$prefix/tmp"
touch "$prefix/.complete"
echo "$bin"
