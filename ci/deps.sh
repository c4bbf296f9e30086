#!/bin/sh
# Installs the Debian packages the build needs when any is missing: as root
# through apt-get, otherwise prints the one line to run. Quiet when all are there.
set -e
# The device machine (ci/device-env.sh) has no network: its packages are unpacked into a prefix.
[ "${DSV4_NO_DEPS:-0}" = 1 ] && exit 0
PKGS="build-essential pkg-config libyaml-dev check libsubunit-dev libopenblas-dev lcov libjansson-dev python3 python3-numpy python3-pip python3-setuptools python3-venv python3-pytest valgrind"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "deps: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
else
    echo "deps: missing packages:$missing" >&2
    echo "deps: run: sudo apt-get install -y$missing" >&2
    exit 1
fi
