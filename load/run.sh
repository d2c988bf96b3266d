#!/usr/bin/env bash
# Load test of the log service with k6: starts `melddb-log serve` on
# loopback over temporary zone directories, runs load/log-service.js
# against its HTTP API, prints the figures, stops the service (SIGTERM,
# graceful) and removes the directories. Exits non-zero when a k6
# threshold fails (99), the service does not come up, or it does not stop
# cleanly.
#
#   load/run.sh [--summary FILE]          # k6's summary JSON goes to FILE
#   DURATION=60s RATE=1000 RECORD_BYTES=4096 P99_MS=100 load/run.sh
#
# k6 is taken from $K6, the PATH or ~/go/bin/k6 (`go install
# go.k6.io/k6@latest`, as .ci/run does).
set -euo pipefail
cd "$(dirname "$0")/.."

summary=""
while [ $# -gt 0 ]; do
  case "$1" in
    --summary) summary="$2"; shift 2 ;;
    *) echo "usage: load/run.sh [--summary FILE]" >&2; exit 2 ;;
  esac
done

k6="${K6:-$(command -v k6 || echo "$HOME/go/bin/k6")}"
if [ ! -x "$k6" ]; then
  echo "k6 not found: install it with 'go install go.k6.io/k6@latest'" >&2
  exit 2
fi

cargo build --release -p melddb-log --quiet
bin="${CARGO_TARGET_DIR:-target}/release/melddb-log"

work="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
summary="${summary:-$work/summary.json}"
max_record=65536

cat > "$work/log.toml" <<CONF
zones = ["$work/z0", "$work/z1", "$work/z2", "$work/z3", "$work/z4"]
data_shards = 4
parity_shards = 1
page_bytes = 262144
segment_bytes = 67108864
fsync = true
max_record_bytes = $max_record

[listen]
tcp = "127.0.0.1:0"
http = "127.0.0.1:0"

[tokens.load-writer]
logs = ["load"]
read = true
append = true

[tokens.load-reader]
logs = ["load"]
read = true
append = false
CONF

"$bin" serve --config "$work/log.toml" > "$work/addr.json" 2> "$work/service.log" &
pid=$!
for _ in $(seq 1 100); do
  [ -s "$work/addr.json" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [ ! -s "$work/addr.json" ]; then
  echo "the service did not start; its log:" >&2
  cat "$work/service.log" >&2
  exit 1
fi
http="$(sed -E 's/.*"http":"([^"]+)".*/\1/' "$work/addr.json")"
echo "service on http://$http (zones in $work)"

set +e
K6_NO_USAGE_REPORT=true "$k6" run --quiet --no-color \
  --summary-export "$summary" \
  -e BASE_URL="http://$http" \
  -e MAX_RECORD_BYTES="$max_record" \
  -e DURATION="${DURATION:-20s}" \
  -e RATE="${RATE:-400}" \
  -e RECORD_BYTES="${RECORD_BYTES:-1024}" \
  -e P99_MS="${P99_MS:-250}" \
  load/log-service.js
k6_status=$?
set -e

# Graceful stop: SIGTERM, the service finishes in-flight work and exits 0.
kill -TERM "$pid"
set +e
wait "$pid"
svc_status=$?
set -e
pid=""

node -e '
const s = require(process.argv[1]);
const m = s.metrics;
const d = (k) => m[k] || {};
const a = d("http_req_duration{scenario:appenders}");
const r = d("http_req_duration{scenario:readers}");
const n = (k) => (d(k).count || 0);
console.log(JSON.stringify({
  appends_per_s: Math.round(d("http_reqs{op:append}").rate || 0),
  reads_per_s: Math.round(d("http_reqs{op:read}").rate || 0),
  http_requests: n("http_reqs"),
  append_p50_ms: a.med, append_p99_ms: a["p(99)"],
  read_p50_ms: r.med, read_p99_ms: r["p(99)"],
  checks_passed: d("checks").passes, checks_failed: d("checks").fails,
  dropped_iterations: n("dropped_iterations"),
}));
' "$summary" || true

if [ "$svc_status" -ne 0 ]; then
  echo "the service exited with $svc_status on SIGTERM; its log:" >&2
  tail -n 40 "$work/service.log" >&2
  exit 1
fi
if [ "$k6_status" -ne 0 ]; then
  echo "k6 failed (exit $k6_status): a check or threshold did not hold" >&2
  tail -n 20 "$work/service.log" >&2
  exit "$k6_status"
fi
echo "load test passed"
