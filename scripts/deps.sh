#!/usr/bin/env bash
# Install mbpipe's build and test dependencies from Debian's packages, only those missing.
# Runs as root (as on a fresh Debian 12 machine) or through sudo.
set -euo pipefail

PKGS=(build-essential autoconf automake libtool pkg-config autoconf-archive git
      libopenblas-dev liburcu-dev libjemalloc-dev check
      libmicrohttpd-dev libcjson-dev zlib1g-dev dataset-fashion-mnist clang clang-format
      libboost-dev libck-dev libreaderwriterqueue-dev libtbb-dev wrk curl
      libopenmpi-dev openmpi-bin man-db iproute2 jq)  # the README's `man -l`; `ip` for scripts/check-readme.sh's network namespace; jq: tests/mpi.sh

missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "deps: all ${#PKGS[@]} packages present"
	exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null || { echo "deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
	SUDO=sudo
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
