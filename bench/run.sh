#!/usr/bin/env bash
# Runs the same agent workload against a three-node idemkv cluster, a three-member etcd
# cluster and a PostgreSQL server, all on loopback on this machine, all durable (fsync
# on; PostgreSQL synchronous_commit=on), and writes the comparison as JSON, Markdown and
# a PNG chart.
#
#   bench/run.sh [compare flags…]   the comparison (see `go run . -h` in bench/)
#   bench/run.sh test               start etcd and PostgreSQL, run the bench module's tests
#   bench/run.sh up                 start all three and wait (Ctrl-C stops them)
#
# Environment: BENCH_DIR (data dirs; default a fresh dir under /var/tmp, removed at
# exit unless KEEP=1), BENCH_OUT (results; default bench/results).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mode=compare
case "${1:-}" in
test | up)
	mode=$1
	shift
	;;
esac

log() { printf '%s run.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# install makes sure the peers' servers are here, from Debian's packages.
install() {
	local want=()
	command -v etcd >/dev/null || want+=(etcd-server)
	compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || want+=(postgresql)
	command -v curl >/dev/null || want+=(curl)
	if [ ${#want[@]} -gt 0 ]; then
		log "installing ${want[*]}"
		as_root apt-get update -qq
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >/dev/null
	fi
	command -v go >/dev/null || {
		log "Go is required to build idemkv and the driver"
		exit 1
	}
}

# Ports: well away from the defaults, so a system service of the same name never clashes.
ETCD_CLIENT=(23791 23792 23793)
ETCD_PEER=(23801 23802 23803)
PG_PORT=25432
IDEMKV_HTTP=(27420 27430 27440)
IDEMKV_RAFT=(27421 27431 27441)

pids=()
cleanup() {
	local status=$?
	trap - EXIT INT TERM
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		for _ in $(seq 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.2
		done
		kill -9 "$pid" 2>/dev/null || true
	done
	if [ "${KEEP:-0}" != 1 ] && [ -n "${dir:-}" ] && [ -z "${BENCH_DIR:-}" ]; then
		rm -rf "$dir"
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_for polls a command until it succeeds, for at most $1 seconds.
wait_for() {
	local secs=$1 what=$2
	shift 2
	for _ in $(seq $((secs * 5))); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.2
	done
	log "$what did not come up; its log is in $dir"
	return 1
}

start_etcd() {
	local cluster="" i
	for i in 0 1 2; do
		cluster+="${cluster:+,}e$((i + 1))=http://127.0.0.1:${ETCD_PEER[$i]}"
	done
	for i in 0 1 2; do
		local name="e$((i + 1))"
		etcd --name "$name" --data-dir "$dir/etcd-$name" \
			--listen-client-urls "http://127.0.0.1:${ETCD_CLIENT[$i]}" \
			--advertise-client-urls "http://127.0.0.1:${ETCD_CLIENT[$i]}" \
			--listen-peer-urls "http://127.0.0.1:${ETCD_PEER[$i]}" \
			--initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER[$i]}" \
			--initial-cluster "$cluster" --initial-cluster-state new \
			--initial-cluster-token idemkv-bench \
			>"$dir/etcd-$name.log" 2>&1 &
		pids+=($!)
	done
	for i in 0 1 2; do
		wait_for 60 "etcd e$((i + 1))" curl -fsS "http://127.0.0.1:${ETCD_CLIENT[$i]}/health"
	done
	ETCD_ENDPOINTS="127.0.0.1:${ETCD_CLIENT[0]},127.0.0.1:${ETCD_CLIENT[1]},127.0.0.1:${ETCD_CLIENT[2]}"
	log "etcd $(etcd --version | head -1 | awk '{print $3}') up: $ETCD_ENDPOINTS"
}

start_postgres() {
	local bin
	bin=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d | sort -V | tail -1)
	local as=()
	mkdir -p "$dir/pg" "$dir/pgsock"
	if [ "$(id -u)" = 0 ]; then
		# PostgreSQL refuses to run as root.
		chown postgres: "$dir/pg" "$dir/pgsock"
		chmod 755 "$dir"
		as=(runuser -u postgres --)
	fi
	"${as[@]}" "$bin/initdb" -D "$dir/pg" -U postgres --auth=trust >"$dir/initdb.log" 2>&1
	"${as[@]}" "$bin/postgres" -D "$dir/pg" -p "$PG_PORT" -k "$dir/pgsock" \
		-c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on \
		-c max_connections=400 -c shared_buffers=256MB \
		>"$dir/postgres.log" 2>&1 &
	pids+=($!)
	wait_for 60 postgres "$bin/pg_isready" -h 127.0.0.1 -p "$PG_PORT"
	# runuser may not pass a signal on: stop the postmaster itself too.
	pids+=("$(head -1 "$dir/pg/postmaster.pid")")
	PG_DSN="postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
	log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') up: port $PG_PORT"
}

start_idemkv() {
	log "building idemkv"
	(cd "$here/.." && go build -o "$dir/idemkv" ./cmd/idemkv)
	local i join=()
	for i in 0 1 2; do
		local id="n$((i + 1))"
		"$dir/idemkv" serve --id "$id" --data-dir "$dir/idemkv-$id" \
			--http-addr "127.0.0.1:${IDEMKV_HTTP[$i]}" --raft-addr "127.0.0.1:${IDEMKV_RAFT[$i]}" \
			--log-level warn --pprof "${join[@]}" >"$dir/idemkv-$id.log" 2>&1 &
		pids+=($!)
		wait_for 60 "idemkv $id" curl -fsS "http://127.0.0.1:${IDEMKV_HTTP[$i]}/readyz"
		join=(--join "127.0.0.1:${IDEMKV_HTTP[0]}")
	done
	wait_for 60 "the three-node idemkv cluster" bash -c \
		"[ \$(curl -fsS http://127.0.0.1:${IDEMKV_HTTP[0]}/v1/cluster | grep -o '\"suffrage\":\"voter\"' | wc -l) = 3 ]"
	IDEMKV_ENDPOINTS="127.0.0.1:${IDEMKV_HTTP[0]},127.0.0.1:${IDEMKV_HTTP[1]},127.0.0.1:${IDEMKV_HTTP[2]}"
	log "idemkv up: $IDEMKV_ENDPOINTS"
}

install
dir=${BENCH_DIR:-$(mktemp -d /var/tmp/idemkv-bench.XXXXXX)}
mkdir -p "$dir"
log "data dirs in $dir"
start_etcd
start_postgres

case "$mode" in
up)
	start_idemkv
	echo "export IDEMKV_BENCH_ETCD=$ETCD_ENDPOINTS IDEMKV_BENCH_PG='$PG_DSN' IDEMKV_BENCH_IDEMKV=$IDEMKV_ENDPOINTS"
	log "running; Ctrl-C stops"
	# A foreground sleep would hold the signal until it ends; wait returns at once.
	sleep infinity &
	pids+=($!)
	wait $!
	;;
test)
	cd "$here"
	IDEMKV_BENCH_ETCD=$ETCD_ENDPOINTS IDEMKV_BENCH_PG=$PG_DSN go test -race -count=1 ./...
	;;
compare)
	start_idemkv
	out=${BENCH_OUT:-$here/results}
	mkdir -p "$out"
	cd "$here"
	go run . --idemkv "$IDEMKV_ENDPOINTS" --etcd "$ETCD_ENDPOINTS" --pg "$PG_DSN" \
		--fsync-dir "$dir" --out "$out" "$@"
	;;
esac
