#!/usr/bin/env bash
# System packages the tests need: Debian's Chromium (browser tests) and Noto CJK fonts
# (Chinese in figures and in the browser). Installs only what is missing.
set -euo pipefail
# (No `grep -q` after a pipe: it exits at the first match, fc-list then dies of SIGPIPE, and
# pipefail turns that into a failure.)
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
fc-list 2>/dev/null | grep "Noto Sans CJK" >/dev/null || need+=(fonts-noto-cjk)
if [ ${#need[@]} -eq 0 ]; then
  echo "system packages: chromium and fonts-noto-cjk already present"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "missing system packages: ${need[*]}. Install them with your package manager (Debian: apt-get install ${need[*]})." >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing system packages: ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" fontconfig >/dev/null
fc-cache -f >/dev/null 2>&1 || true
# Fail here, with the reason, rather than later in the browser tests.
command -v chromium >/dev/null 2>&1 || { echo "chromium is still missing after apt-get install" >&2; exit 1; }
fc-list 2>/dev/null | grep "Noto Sans CJK" >/dev/null || { echo "Noto Sans CJK is still missing after apt-get install fonts-noto-cjk" >&2; exit 1; }
echo "system packages: chromium and fonts-noto-cjk installed"
