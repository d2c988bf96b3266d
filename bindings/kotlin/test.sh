#!/usr/bin/env bash
# Builds melddb-ffi (release), generates the Kotlin layer and runs the
# Kotlin tests with Maven (JVM 17). Output ends with Surefire's
# "Tests run:" lines.
set -euo pipefail
cd "$(dirname "$0")/../.."
target="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
bash bindings/generate.sh --release >/dev/null
cd bindings/kotlin
mvn -B -Dstyle.color=never test -Dmelddb.lib.dir="$target/release"
