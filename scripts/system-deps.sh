#!/usr/bin/env bash
# Debian packages omni-rtc needs. The server (`system-deps.sh serve`, run by `make serve`): libopus0
# (media/libopus.py: Opus FEC and concealment through libopus itself). The test suite as well
# (no argument, run by `make test`): Chromium for the browser test, npm to install the OpenAI
# Agents JS SDK it drives (tests/e2e/sdk), espeak-ng, flite and sox to regenerate the speech
# fixtures, util-linux and iproute2 for the offline sandbox (and the TURN test's network
# namespaces), nginx, Caddy and coturn for the deployment's edge tests (docs/DEPLOY.md).
# Installs only what is missing (CI runs as root).
set -euo pipefail
missing=()
ldconfig -p | grep 'libopus\.so\.0 ' >/dev/null || missing+=(libopus0)
if [ "${1:-}" != "serve" ]; then
  command -v chromium >/dev/null || missing+=(chromium)
  command -v npm >/dev/null || missing+=(npm)
  command -v espeak-ng >/dev/null || missing+=(espeak-ng)
  command -v flite >/dev/null || missing+=(flite)
  command -v sox >/dev/null || missing+=(sox)
  command -v unshare >/dev/null || missing+=(util-linux)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v nsenter >/dev/null || missing+=(util-linux)
  command -v nginx >/dev/null || missing+=(nginx)
  command -v caddy >/dev/null || missing+=(caddy)
  command -v turnserver >/dev/null || missing+=(coturn)
fi
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
# The tests run their own nginx, Caddy and coturn with their own configs: the services just
# installed with them (listening on 80, 443 and 3478 where systemd runs them) are not wanted.
if [ -d /run/systemd/system ]; then
  for service in nginx caddy coturn; do
    if [[ " ${missing[*]} " == *" $service "* ]]; then systemctl disable --now "$service" 2>/dev/null || true; fi
  done
fi
