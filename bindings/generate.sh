#!/usr/bin/env bash
# Generates the Swift and Kotlin layers of melddb-ffi from the built
# library (UniFFI library mode) into bindings/generated/ (never committed).
# Usage: bindings/generate.sh [--release]
set -euo pipefail
cd "$(dirname "$0")/.."
profile=debug
flag=()
if [ "${1:-}" = "--release" ]; then profile=release; flag=(--release); fi
target="${CARGO_TARGET_DIR:-target}"
# Separate builds: built together, feature unification would pull the
# generator's dependencies into the library.
cargo build "${flag[@]}" -p melddb-ffi
cargo build "${flag[@]}" -p uniffi-bindgen
case "$(uname -s)" in
  Darwin) lib="$target/$profile/libmelddb_ffi.dylib" ;;
  *) lib="$target/$profile/libmelddb_ffi.so" ;;
esac
out=bindings/generated
rm -rf "$out"
"$target/$profile/uniffi-bindgen" generate --library "$lib" \
  --language swift --language kotlin --out-dir "$out" --no-format
echo "generated from $lib:"
find "$out" -type f | sort
