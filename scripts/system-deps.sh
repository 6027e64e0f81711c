#!/usr/bin/env bash
# Debian packages the server and the test suite need: libopus0 (media/libopus.py: Opus FEC and
# concealment through libopus itself), Chromium for the browser test, espeak-ng, flite and sox to
# regenerate the speech fixtures. Installs only what is missing (CI runs as root).
set -euo pipefail
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v espeak-ng >/dev/null || missing+=(espeak-ng)
command -v flite >/dev/null || missing+=(flite)
command -v sox >/dev/null || missing+=(sox)
command -v unshare >/dev/null || missing+=(util-linux)
command -v ip >/dev/null || missing+=(iproute2)
ldconfig -p | grep -q 'libopus\.so\.0 ' || missing+=(libopus0)
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
