#!/usr/bin/env bash
# A short all-nemesis jepsen-lite run for CI: every fault family on a three-node
# cluster for JEPSEN_TIME (default 90 s). Exits non-zero on any anomaly (1) or when
# the harness itself fails (2); the output directory is kept for inspection.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${JEPSEN_OUT:-$(mktemp -d -t jepsen-ci-XXXXXX)}"
bin="$(mktemp -d -t jepsen-bin-XXXXXX)/jepsen-lite"
go build -o "$bin" ./jepsen-lite
status=0
"$bin" --nodes 3 --time "${JEPSEN_TIME:-90s}" --concurrency 12 --nemesis all \
	--quiet 3s --hold 6s --out "$out" || status=$?
# The history and the idemkv binary are large; the rest is what a person reads.
rm -f "$out/idemkv"
echo "jepsen-lite: output in $out (summary.json, timeline.svg, linearizability.html, node logs)"
exit "$status"
