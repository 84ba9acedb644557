#!/bin/sh
# Install what mcv needs on Debian 12, only what is missing.
# Idempotent and quiet when there is nothing to do. Called by `make check`,
# `make demo` and .ci/run; safe to run by hand.
#   scripts/setup.sh          build + test dependencies (Debian packages, peer)
#   scripts/setup.sh --no-peer   skip llama.cpp's npm package
set -eu
here=$(cd "$(dirname "$0")" && pwd)
peer=1
[ "${1:-}" = "--no-peer" ] && peer=0

# Build: compiler, pkg-config and the four media libraries (required, not optional).
# Test: bats, groff (man page lint), python3 + torch/numpy/PIL (reference model),
# openblas (makes torch ~30x faster here), fonts (synthetic data), archivers.
pkgs="gcc make pkg-config libpng-dev libjpeg62-turbo-dev libavformat-dev
libavcodec-dev libswscale-dev libarchive-dev bats groff-base python3
python3-numpy python3-torch python3-pil libopenblas0-pthread fonts-dejavu-core
zstd libarchive-tools"

missing=""
# Node.js + npm run the llama.cpp peer; many images ship their own node, so
# ask apt only when there is none.
command -v npm >/dev/null 2>&1 || pkgs="$pkgs nodejs npm"
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
		missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "setup: installing Debian packages:$missing" >&2
	if [ "$(id -u)" != 0 ]; then
		echo "setup: need root to install packages (run: sudo $0)" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# The peer: llama.cpp's prebuilt CPU library, pinned, installed beside its harness.
if [ $peer = 1 ]; then
	lib="$here/peer/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so"
	if [ ! -f "$lib" ]; then
		echo "setup: installing node-llama-cpp 3.22.1 (llama.cpp peer)" >&2
		(cd "$here/peer" && npm install --no-audit --no-fund --loglevel=error --ignore-scripts >/dev/null)
	fi
fi
exit 0
