#!/usr/bin/env bash
# Configures and builds Fulcrum (Release) into build/ (or $FULCRUM_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${FULCRUM_BUILD_DIR:-build}"
JOBS="${FULCRUM_JOBS:-$(nproc)}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >&2
fi
cmake --build "$BUILD_DIR" -j "$JOBS" "$@" >&2
