#!/usr/bin/env bash
# Short jepsen-lite runs for CI on a three-node cluster: every fault family for
# JEPSEN_TIME (default 60 s), then the families of issue 12 alone (leader churn without
# writes, storage faults, clock jumps) and issue 22's Raft-port flood for
# JEPSEN_NEW_TIME (default 30 s), then issue 22's clock restarts for JEPSEN_CLOCK_TIME
# (default 30 s) and its Raft-port flood for JEPSEN_FLOOD_TIME (default 20 s), so that
# each of them is drawn in CI. Exits
# non-zero on any anomaly (1) or when the harness itself fails (2); the output
# directories are kept for inspection.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${JEPSEN_OUT:-$(mktemp -d -t jepsen-ci-XXXXXX)}"
bin="$(mktemp -d -t jepsen-bin-XXXXXX)/jepsen-lite"
go build -o "$bin" ./jepsen-lite
status=0
"$bin" --nodes 3 --time "${JEPSEN_TIME:-60s}" --concurrency 12 --nemesis all \
	--quiet 3s --hold 6s --out "$out/all" || status=$?
# Reuse the idemkv binary the first run built.
new=0
"$bin" --nodes 3 --time "${JEPSEN_NEW_TIME:-30s}" --concurrency 12 --nemesis churn,storage,clock-jump,raft-port \
	--quiet 2s --hold 5s --binary "$out/all/idemkv" --out "$out/new" || new=$?
# Issue 22's clock restarts on their own: every node killed, one started with its
# clock hours off; they kill the whole cluster, so "all" draws them rarely.
clock=0
"$bin" --nodes 3 --time "${JEPSEN_CLOCK_TIME:-30s}" --concurrency 12 --nemesis clock-restart \
	--quiet 2s --hold 5s --binary "$out/all/idemkv" --out "$out/clock" || clock=$?
# Issue 22's Raft-port flood on its own, so that every CI run draws it (in the run
# above it is one family of four): idle sockets on every Raft port, the leader killed.
flood=0
"$bin" --nodes 3 --time "${JEPSEN_FLOOD_TIME:-20s}" --concurrency 12 --nemesis raft-port \
	--quiet 2s --hold 5s --binary "$out/all/idemkv" --out "$out/flood" || flood=$?
# Anomalies in any run (1) outrank a harness failure in any (2).
if [ "$status" -eq 1 ] || [ "$new" -eq 1 ] || [ "$clock" -eq 1 ] || [ "$flood" -eq 1 ]; then
	status=1
elif [ "$status" -ne 0 ] || [ "$new" -ne 0 ] || [ "$clock" -ne 0 ] || [ "$flood" -ne 0 ]; then
	status=2
fi
# The history and the idemkv binary are large; the rest is what a person reads.
rm -f "$out/all/idemkv"
echo "jepsen-lite: output in $out/all, $out/new, $out/clock and $out/flood (summary.json, timeline.svg, linearizability.html, node logs)"
exit "$status"
