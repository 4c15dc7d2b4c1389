#!/usr/bin/env bash
# check_docker_runtime.sh [ROOT]: the runtime stage of deploy/docker/
# fulcrum.Dockerfile installs every shared library the built binaries load
# (ctest: deploy.docker_runtime_packages).
#
# The image build checks this too (`ldd ... | grep 'not found'` fails it), but
# images are not built by the test suite; this catches a new dependency the
# day it is linked, on a machine without Docker. For every library `ldd`
# lists for fulcrum, fulcrum-scheduler, fulcrum-server and fulcrum-worker, the
# Debian package that owns it (dpkg -S) must be one the runtime stage installs,
# a dependency of one (apt-cache depends --recurse), or a package every
# debian:12-slim has (Priority required; plus libstdc++6 and libgcc-s1, which
# apt itself needs). Every package the stage names must exist in the
# archive, and nothing it names may be unused beyond the known extras.
#
# Exit 77 (ctest SKIP_RETURN_CODE) when the binaries are not built or dpkg /
# apt-cache are missing. The binaries: $FULCRUM_BIN_DIR, else
# ROOT/${FULCRUM_BUILD_DIR:-build}/bin.
set -euo pipefail

ROOT="$(cd "${1:-$(dirname "$0")/../..}" && pwd)"
DOCKERFILE="$ROOT/deploy/docker/fulcrum.Dockerfile"
BIN="${FULCRUM_BIN_DIR:-$ROOT/${FULCRUM_BUILD_DIR:-build}/bin}"
BINARIES=(fulcrum fulcrum-scheduler fulcrum-server fulcrum-worker)

for tool in dpkg apt-cache ldd; do
  command -v "$tool" >/dev/null 2>&1 || { echo "SKIP: $tool not found"; exit 77; }
done
for b in "${BINARIES[@]}"; do
  [ -x "$BIN/$b" ] || { echo "SKIP: $BIN/$b is not built"; exit 77; }
done

# The packages after `apt-get install` in the last stage (the runtime one).
runtime_stage="$(awk '/^FROM /{stage=""} {stage = stage $0 "\n"} END {printf "%s", stage}' "$DOCKERFILE")"
listed="$(printf '%s' "$runtime_stage" |
  awk '/apt-get install/ {on = 1; print; next} on && /^ *&&/ {on = 0} on {print}' | tr ' \\' '\n\n' |
  grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vE '^(apt-get|install|-y|--no-install-recommends)$' | sort -u)"
if [ -z "$listed" ]; then
  echo "FAIL: no apt-get install list found in the last stage of $DOCKERFILE"
  exit 1
fi
# Not libraries, or not for ldd to find: certificates for TLS peers, the
# default data set.
EXTRAS="ca-certificates dataset-fashion-mnist"

failed=0
# shellcheck disable=SC2086
known="$(apt-cache show --no-all-versions $listed 2>/dev/null | awk '/^Package: / {print $2}' | sort -u)"
for package in $listed; do
  if ! grep -qx "$package" <<<"$known"; then
    echo "FAIL: $DOCKERFILE installs $package, which apt-cache does not know"
    failed=1
  fi
done

provided="$( (printf '%s\n' $listed
  # shellcheck disable=SC2086
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances $listed 2>/dev/null | awk '/Depends:/ {print $2}' | tr -d '<>'
  dpkg-query -W -f '${Package} ${Priority}\n' | awk '$2 == "required" {print $1}'
  printf '%s\n' libstdc++6 libgcc-s1) | sed 's/:.*//' | sort -u)"

# One dpkg -S for every library, by the path ldd gives and by its target
# (each call reads dpkg's whole file list, so one per library took a minute).
libs="$(for b in "${BINARIES[@]}"; do ldd "$BIN/$b"; done | awk '/=>/ {print $3}' | sort -u)"
# shellcheck disable=SC2086
owners="$( (dpkg -S $libs; for lib in $libs; do readlink -f "$lib"; done | sort -u | xargs dpkg -S) 2>/dev/null || true)"
# The package owning path $1 ("" if none).
owner_of() { awk -v path="$1" 'index($0, ": " path) && substr($0, length($0) - length(path) + 1) == path {print; exit}' <<<"$owners"; }

needed=""
while read -r lib; do
  [ -n "$lib" ] || continue
  owner="$(owner_of "$lib")"
  [ -n "$owner" ] || owner="$(owner_of "$(readlink -f "$lib")")"
  if [ -z "$owner" ]; then
    echo "FAIL: $lib (loaded by the binaries) belongs to no Debian package: the image cannot get it"
    failed=1
    continue
  fi
  package="${owner%%:*}"
  needed="$needed $package"
  if ! grep -qx "$package" <<<"$provided"; then
    echo "FAIL: the binaries load $lib from $package, which the runtime stage of $DOCKERFILE does not install"
    failed=1
  fi
done <<<"$libs"

for package in $listed; do
  case " $needed $EXTRAS " in
    *" $package "*) ;;
    *) echo "FAIL: $DOCKERFILE installs $package, which no binary loads (drop it, or list it in EXTRAS here)"
       failed=1 ;;
  esac
done

if [ "$failed" -ne 0 ]; then exit 1; fi
echo "OK: the runtime stage installs all $(wc -w <<<"$listed") packages the binaries need ($(tr ' ' '\n' <<<"$needed" | sort -u | grep -c .) owners of $(grep -c . <<<"$libs") libraries)"
