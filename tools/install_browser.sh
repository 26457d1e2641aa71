#!/usr/bin/env bash
# Install the headless browser the UI test drives: Debian's own `chromium` and `chromium-driver`
# packages (no browser download by a test tool). Does nothing when both are already there.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
# A browser and driver named in the environment (a CI image with Chrome preinstalled): use those.
if [ -n "${CHROMIUM:-}" ] && [ -x "${CHROMIUM}" ] && [ -n "${CHROMEDRIVER:-}" ] && [ -x "${CHROMEDRIVER}" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser: need /usr/bin/chromium and /usr/bin/chromedriver (Debian/Ubuntu: apt-get install chromium chromium-driver)" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver
test -x /usr/bin/chromium && test -x /usr/bin/chromedriver
/usr/bin/chromium --version
