#!/usr/bin/env bash
# System packages the tests need: Debian's Chromium (browser tests, the PDF), Noto CJK fonts
# (Chinese in the browser and the PDF; the source of attn_lib's bundled font subset) and
# poppler-utils (pdftotext, pdffonts, pdfinfo, pdftoppm: make pdf and the PDF's tests).
# Installs only what is missing.
set -euo pipefail
# (No `grep -q` after a pipe: it exits at the first match, fc-list then dies of SIGPIPE, and
# pipefail turns that into a failure.)
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
fc-list 2>/dev/null | grep "Noto Sans CJK" >/dev/null || need+=(fonts-noto-cjk)
command -v pdftotext >/dev/null 2>&1 && command -v pdffonts >/dev/null 2>&1 || need+=(poppler-utils)
if [ ${#need[@]} -eq 0 ]; then
  echo "system packages: chromium, fonts-noto-cjk and poppler-utils already present"
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
command -v pdftotext >/dev/null 2>&1 || { echo "pdftotext is still missing after apt-get install poppler-utils" >&2; exit 1; }
echo "system packages: ${need[*]} installed"
