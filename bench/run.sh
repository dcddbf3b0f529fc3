#!/usr/bin/env bash
# Runs the same agent workload against idemkv, etcd and PostgreSQL, all on loopback on
# this machine, all durable (every acknowledged write fsynced), and writes the
# comparison as JSON, Markdown and a PNG chart. It leads with like-for-like pairings:
#
#   three idemkv nodes   vs  a PostgreSQL primary with two quorum-synchronous standbys
#                            (synchronous_standby_names 'ANY 1 (s1, s2)', synchronous_commit on)
#   one idemkv node      vs  one PostgreSQL server (fsync on, synchronous_commit on)
#   three idemkv nodes   vs  a three-member etcd cluster
#
# and runs each idemkv size once per Raft log backend (RAFT_LOGS), so the backends
# are compared in the same run.
#
#   bench/run.sh [compare flags…]   the comparison (see `go run . -h` in bench/)
#   bench/run.sh test               start etcd and both PostgreSQL setups, run the bench module's tests
#   bench/run.sh up                 start everything and wait (Ctrl-C stops it)
#   bench/run.sh scale COUNTS [--clients N] [--duration D] [--warmup D] [--rounds R]
#                      [--settle-max SECS]
#                                   idemkv alone: reserve latency against COUNTS stored
#                                   records (e.g. 10000,10000000), each on a three-node
#                                   cluster restored from a seeded backup (see README.md)
#
# Environment: IDEMKV_BIN (an idemkv binary to measure instead of building this
# checkout's), ROUNDS (measure every system this many times, in turn; each point is then
# the median round, default 1), RAFT_LOGS (idemkv's Raft log backends to run, each passed to `idemkv
# serve --raft-log`; default "bolt wal", or bolt alone, without the flag, when the
# binary has no --raft-log), BENCH_DIR (data dirs; default a fresh dir under /var/tmp,
# removed at exit unless KEEP=1), BENCH_OUT (results; default bench/results),
# SEED_CACHE (scale's seeded backups, kept across runs; default
# /var/tmp/idemkv-bench-seeds), SEED_HISTORY (non-empty: seeded records carry the execute
# and commit events of their history, as records written through this binary's API do),
# IDEMKV_GOMAXPROCS (GOMAXPROCS of every idemkv node; default Go's: see the README's
# Performance section and docs/operations.md).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mode=compare
case "${1:-}" in
test | up)
	mode=$1
	shift
	;;
scale)
	mode=scale
	shift
	;;
esac

log() { printf '%s run.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# node_env is the environment every idemkv node starts with (IDEMKV_GOMAXPROCS).
node_env=()
if [ -n "${IDEMKV_GOMAXPROCS:-}" ]; then
	if ! [[ "$IDEMKV_GOMAXPROCS" =~ ^[1-9][0-9]*$ ]]; then
		log "IDEMKV_GOMAXPROCS='$IDEMKV_GOMAXPROCS': want a positive whole number (Go ignores anything else)"
		exit 2
	fi
	node_env=("GOMAXPROCS=$IDEMKV_GOMAXPROCS")
fi

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# install makes sure the peers' servers are here, from Debian's packages.
install() {
	local want=()
	if [ "$mode" = scale ]; then
		command -v jq >/dev/null || want+=(jq)
	else
		command -v etcd >/dev/null || want+=(etcd-server)
		compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || want+=(postgresql)
	fi
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
PG_PORT=25432                     # the single server
PG_SYNC_PORTS=(25442 25443 25444) # the primary, standby s1, standby s2
# The idemkv cluster started k-th (from 0) gives node i HTTP port IDEMKV_BASE+100k+10i
# and the Raft port above it.
IDEMKV_BASE=27420
# The scale mode's clusters get their own ports, so that it can run beside a comparison.
SCALE_HTTP=(26420 26430 26440)
SCALE_RAFT=(26421 26431 26441)

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

# pg_setup finds PostgreSQL's programs. PostgreSQL refuses to run as root: as root,
# its servers and tools run as the postgres user.
pg_setup() {
	PG_BIN=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d | sort -V | tail -1)
	pg_as=()
	mkdir -p "$dir/pgsock"
	if [ "$(id -u)" = 0 ]; then
		chown postgres: "$dir/pgsock"
		chmod 755 "$dir"
		pg_as=(runuser -u postgres --)
	fi
}

# pg_dir NAME makes the empty data dir NAME for the user the servers run as.
pg_dir() {
	mkdir -p "$dir/$1"
	chmod 700 "$dir/$1"
	if [ "$(id -u)" = 0 ]; then chown postgres: "$dir/$1"; fi
}

# pg_start NAME PORT starts the server of data dir NAME on PORT, durable as the
# comparison needs, and waits until it accepts connections.
pg_start() {
	local name=$1 port=$2
	"${pg_as[@]}" "$PG_BIN/postgres" -D "$dir/$name" -p "$port" -k "$dir/pgsock" \
		-c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on \
		-c max_connections=400 -c shared_buffers=256MB \
		>"$dir/$name.log" 2>&1 &
	pids+=($!)
	wait_for 60 "PostgreSQL $name" "$PG_BIN/pg_isready" -h 127.0.0.1 -p "$port"
	# runuser may not pass a signal on: stop the postmaster itself too.
	pids+=("$(head -1 "$dir/$name/postmaster.pid")")
}

psql_at() {
	local port=$1
	shift
	"$PG_BIN/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -XAtq "$@"
}

start_postgres() {
	pg_dir pg
	"${pg_as[@]}" "$PG_BIN/initdb" -D "$dir/pg" -U postgres --auth=trust >"$dir/initdb-pg.log" 2>&1
	pg_start pg "$PG_PORT"
	PG_DSN="postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
	log "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') up: one server, port $PG_PORT"
}

# pg_quorum: the primary commits with synchronous_commit on, waiting for any one of
# s1 and s2, and both stream with sync_state quorum.
pg_quorum() {
	local p=${PG_SYNC_PORTS[0]}
	[ "$(psql_at "$p" -c 'SHOW synchronous_standby_names')" = "ANY 1 (s1, s2)" ] &&
		[ "$(psql_at "$p" -c 'SHOW synchronous_commit')" = on ] &&
		[ "$(psql_at "$p" -c "SELECT string_agg(application_name || ':' || state || ':' || sync_state, ',' ORDER BY application_name) FROM pg_stat_replication")" = "s1:streaming:quorum,s2:streaming:quorum" ]
}

# start_postgres_sync starts a primary and two streaming standbys, s1 and s2, cloned
# with pg_basebackup -R (each with a replication slot and its application_name in
# primary_conninfo), then makes commits wait for either standby's flush, and checks
# that both stream in quorum.
start_postgres_sync() {
	local p=${PG_SYNC_PORTS[0]} i
	pg_dir pg-primary
	"${pg_as[@]}" "$PG_BIN/initdb" -D "$dir/pg-primary" -U postgres --auth=trust >"$dir/initdb-pg-primary.log" 2>&1
	pg_start pg-primary "$p"
	for i in 1 2; do
		pg_dir "pg-s$i"
		if ! "${pg_as[@]}" "$PG_BIN/pg_basebackup" -d "host=127.0.0.1 port=$p user=postgres application_name=s$i" \
			-D "$dir/pg-s$i" -R -X stream -C -S "s$i" --checkpoint=fast >"$dir/pg_basebackup-s$i.log" 2>&1; then
			log "pg_basebackup of standby s$i failed; its log is in $dir"
			exit 1
		fi
		if ! grep -q "application_name=s$i" "$dir/pg-s$i/postgresql.auto.conf"; then
			log "standby s$i: pg_basebackup -R wrote no application_name=s$i into primary_conninfo:"
			cat "$dir/pg-s$i/postgresql.auto.conf" >&2
			exit 1
		fi
		pg_start "pg-s$i" "${PG_SYNC_PORTS[$i]}"
	done
	# Only now: with the setting on before the standbys stream, commits would wait.
	psql_at "$p" -c "ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (s1, s2)'" -c "SELECT pg_reload_conf()" >/dev/null
	if ! wait_for 60 "PostgreSQL quorum replication" pg_quorum; then
		log "PostgreSQL replication is not what the comparison needs (s1 and s2 streaming, sync_state quorum, synchronous_standby_names 'ANY 1 (s1, s2)', synchronous_commit on); the primary says:"
		psql_at "$p" -c 'SHOW synchronous_standby_names' -c 'SHOW synchronous_commit' \
			-c 'SELECT application_name, state, sync_state FROM pg_stat_replication' >&2 || true
		exit 1
	fi
	PG_SYNC_DSN="postgres://postgres@127.0.0.1:$p/postgres?sslmode=disable"
	log "PostgreSQL primary up: port $p; standbys s1 (${PG_SYNC_PORTS[1]}) and s2 (${PG_SYNC_PORTS[2]}) streaming, sync_state quorum, synchronous_standby_names 'ANY 1 (s1, s2)'"
}

build_idemkv() {
	if [ -n "${IDEMKV_BIN:-}" ]; then
		log "building the driver; idemkv is $IDEMKV_BIN"
		cp "$IDEMKV_BIN" "$dir/idemkv"
	else
		log "building idemkv and the driver"
		(cd "$here/.." && go build -o "$dir/idemkv" ./cmd/idemkv)
	fi
	(cd "$here" && go build -o "$dir/bench" .)
	if "$dir/idemkv" serve -h 2>&1 | grep -q -- '--raft-log'; then
		raft_log_flag=1
		RAFT_LOGS=${RAFT_LOGS:-bolt wal}
	else
		raft_log_flag=0
		if [ -n "${RAFT_LOGS:-}" ] && [ "$RAFT_LOGS" != bolt ]; then
			log "this idemkv has no --raft-log flag: running its one Raft log (bolt), not RAFT_LOGS='$RAFT_LOGS'"
		fi
		RAFT_LOGS=bolt
	fi
	log "Raft log backends: $RAFT_LOGS"
}

# start_idemkv NODES BACKEND starts a cluster of NODES nodes on the Raft log BACKEND,
# on the next free ports, and leaves its API addresses, comma separated, in endpoints.
clusters=0
floors_due=1 # the next part measures the floors (alone)
start_idemkv() {
	local n=$1 backend=$2 name="idemkv$1-$2" i join=() flags=()
	local base=$((IDEMKV_BASE + 100 * clusters))
	clusters=$((clusters + 1))
	if [ "$raft_log_flag" = 1 ]; then flags=(--raft-log "$backend"); fi
	endpoints=""
	for ((i = 0; i < n; i++)); do
		local id="n$((i + 1))" http=$((base + 10 * i))
		env "${node_env[@]}" "$dir/idemkv" serve --id "$id" --data-dir "$dir/$name-$id" \
			--http-addr "127.0.0.1:$http" --raft-addr "127.0.0.1:$((http + 1))" \
			--log-level warn --pprof "${flags[@]}" "${join[@]}" >"$dir/$name-$id.log" 2>&1 &
		pids+=($!)
		wait_for 60 "$name $id" curl -fsS "http://127.0.0.1:$http/readyz"
		join=(--join "127.0.0.1:$base")
		endpoints+="${endpoints:+,}127.0.0.1:$http"
	done
	wait_for 60 "the $n voters of $name" bash -c \
		"[ \$(curl -fsS http://127.0.0.1:$base/v1/cluster | grep -o '\"suffrage\":\"voter\"' | wc -l) = $n ]"
	log "$name up: $endpoints${node_env[*]:+ (${node_env[*]})}"
}

# stop_from N stops the processes started since pids held N, and forgets them.
stop_from() {
	local n=$1 pid
	for pid in "${pids[@]:n}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]:n}"; do
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.2
		done
		kill -9 "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	pids=("${pids[@]:0:n}")
}

# alone START [ARGS…] starts one system with START, which leaves the driver's flags
# for it in flags; measures it with those and the flags run.sh was given, the CPU time
# of the processes START left in pids (and of their descendants) with them; and stops
# it. Each system runs alone while measured: an idle Raft cluster's heartbeats take a
# few percent of a core, which would fall on whichever system is being measured. The
# points go to a part for `bench report`.
alone() {
	local n=${#pids[@]} part
	"$@"
	part="$dir/part-$((${#parts[@]} + 1)).json"
	# Every process the system's start left (nodes, postmasters, members): the driver
	# counts their CPU time and their descendants' (backends, walsenders) per point.
	local sys_pids
	sys_pids=$(IFS=,; echo "${pids[*]:n}")
	log "system $((${#parts[@]} + 1)) of $systems_total: ${flags[*]} (processes $sys_pids and their descendants)"
	# The floors of a write (bench --floors) are measured by the first part of each
	# round; the report keeps each floor's round of median p50.
	local floors=()
	if [ "$floors_due" = 1 ]; then floors_due=0; else floors=(--floors 0); fi
	"$dir/bench" "${flags[@]}" --cpu-pids "$sys_pids" --fsync-dir "$dir" --out "$out" --part "$part" "${floors[@]}" "${bench_args[@]}"
	parts+=("$part")
	stop_from "$n"
}

idemkv_alone() {
	start_idemkv "$1" "$2"
	flags=("--idemkv$1" "$2=$endpoints")
}
postgres_sync_alone() {
	start_postgres_sync
	flags=(--pg-sync "$PG_SYNC_DSN")
}
postgres_alone() {
	start_postgres
	flags=(--pg "$PG_DSN")
}
etcd_alone() {
	start_etcd
	flags=(--etcd "$ETCD_ENDPOINTS")
}

# start_all starts every system of the comparison and leaves the driver's flags in
# targets.
start_all() {
	build_idemkv
	start_etcd
	pg_setup
	start_postgres
	start_postgres_sync
	targets=(--etcd "$ETCD_ENDPOINTS" --pg "$PG_DSN" --pg-sync "$PG_SYNC_DSN")
	local be
	for be in $RAFT_LOGS; do
		start_idemkv 3 "$be"
		targets+=(--idemkv3 "$be=$endpoints")
	done
	for be in $RAFT_LOGS; do
		start_idemkv 1 "$be"
		targets+=(--idemkv1 "$be=$endpoints")
	done
}

# --- scale mode -----------------------------------------------------------------------
# For each record count: seed a backup of that many committed records (cached in
# SEED_CACHE), restore it into n1's data dir, start n1, join n2 and n3 (they get the
# state by Raft snapshot install), wait until the nodes are idle, measure new
# operations, tear the cluster down. Each phase is timed; the points go to
# scale.json and scale.md.

now() { date +%s.%N; }

# since prints the seconds elapsed since a time from now, as a Go duration.
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3fs", b - a }'; }

# stop_nodes stops the current cluster's nodes and forgets them.
stop_nodes() {
	local pid keep=() p
	for pid in "${nodes[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${nodes[@]}"; do
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.2
		done
		kill -9 "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		[[ " ${nodes[*]} " == *" $p "* ]] || keep+=("$p")
	done
	pids=("${keep[@]}")
	nodes=()
}

# start_node ID I [--join ADDR] starts node ID on the scale ports of index I.
start_node() {
	local id=$1 i=$2
	shift 2
	env "${node_env[@]}" "$dir/idemkv" serve --id "$id" --data-dir "$nd/$id" \
		--http-addr "127.0.0.1:${SCALE_HTTP[$i]}" --raft-addr "127.0.0.1:${SCALE_RAFT[$i]}" \
		--log-level info "$@" >>"$nd/$id.log" 2>&1 &
	pids+=($!)
	nodes+=($!)
}

# caught_up VOTERS INDEX: the cluster has VOTERS voters, each answering, each having
# applied everything the leader committed and at least INDEX.
caught_up() {
	"$dir/idemkv" status --json --endpoint "127.0.0.1:${SCALE_HTTP[0]}" 2>/dev/null |
		jq -e --argjson n "$1" --argjson idx "$2" \
			'([.[] | select(.suffrage == "voter" and (.error // "") == "" and .lag == 0 and (.applied_index // 0) >= $idx)] | length) == $n' >/dev/null
}

# wait_idle waits, at most $1 seconds, until the nodes are idle as the comparison's
# points count idle (`bench settle`): compactions after the restore and the snapshot
# installs done. (An idle three-node cluster itself takes 12-15% of a core: its
# leader's AppendEntries every 5-10 ms; node/node.go, CommitTimeout.)
wait_idle() {
	local pids
	pids=$(IFS=,; echo "${nodes[*]}")
	log "$("$dir/bench" settle --cpu-pids "$pids" --settle-max "${1}s")"
}

scale_point() {
	local n=$1 file="$SEED_CACHE/records-$n${SEED_HISTORY:+-history}.backup" t index phases=()
	nd="$dir/scale-$n"
	rm -rf "$nd"
	mkdir -p "$nd"

	# A cached backup is used for a week: its records expire 30 days after seeding.
	if [ -f "$file" ] && [ -z "$(find "$file" -mmin +$((7 * 24 * 60)))" ]; then
		log "$n records: reusing $file"
		phases+=(--phase seed=0s)
	else
		rm -f "$file"
		log "$n records: seeding $file"
		t=$(now)
		"$dir/bench" seed --records "$n" --out "$file" ${SEED_HISTORY:+--history}
		phases+=(--phase "seed=$(since "$t")")
	fi

	t=$(now)
	"$dir/idemkv" restore --from "$file" --data-dir "$nd/n1" --id n1 \
		--raft-addr "127.0.0.1:${SCALE_RAFT[0]}" | tee "$nd/restore.out"
	index=$(sed -n 's/.* at index \([0-9]*\),.*/\1/p' "$nd/restore.out")
	phases+=(--phase "restore=$(since "$t")")
	log "$n records: restored in ${phases[-1]#restore=} (index $index)"

	t=$(now)
	start_node n1 0
	wait_for 1800 "idemkv n1" curl -fsS "http://127.0.0.1:${SCALE_HTTP[0]}/readyz"
	phases+=(--phase "start=$(since "$t")")
	log "$n records: n1 serving after ${phases[-1]#start=}"

	t=$(now)
	local i
	for i in 1 2; do
		start_node "n$((i + 1))" "$i" --join "127.0.0.1:${SCALE_HTTP[0]}"
		# Once a second: at millions of records the install takes minutes, and the
		# status calls should not take CPU from it.
		local waited=0
		until caught_up $((i + 1)) "$index"; do
			if [ $((waited += 1)) -ge 3600 ]; then
				log "n$((i + 1)) did not catch up within an hour; its log is in $nd"
				return 1
			fi
			sleep 1
		done
		log "$n records: n$((i + 1)) a voter and caught up after $(since "$t")"
	done
	phases+=(--phase "install=$(since "$t")")

	t=$(now)
	wait_idle "$settle_max"
	phases+=(--phase "settle=$(since "$t")")
	log "$n records: nodes idle after ${phases[-1]#settle=}; measuring"

	"$dir/bench" scale-point --idemkv "127.0.0.1:${SCALE_HTTP[0]},127.0.0.1:${SCALE_HTTP[1]},127.0.0.1:${SCALE_HTTP[2]}" \
		--records "$n" --concurrency "$clients" --duration "$duration" --warmup "$warmup" --rounds "$rounds" "${phases[@]}" \
		--node-logs "$nd/n1.log,$nd/n2.log,$nd/n3.log" --point "$dir/scale-$n.json"
	points+=("$dir/scale-$n.json")

	stop_nodes
	if [ "${KEEP:-0}" != 1 ]; then rm -rf "$nd"; fi
}

run_scale() {
	local counts=${1:-} n
	[ -n "$counts" ] && [ "${counts#-}" = "$counts" ] || {
		log "usage: run.sh scale COUNTS [--clients N] [--duration D] [--warmup D] [--rounds R] [--settle-max SECS]"
		exit 2
	}
	shift
	clients=16 duration=30s warmup=5s rounds=1 settle_max=900
	while [ $# -gt 0 ]; do
		case "$1" in
		--clients | --duration | --warmup | --rounds | --settle-max)
			[ $# -ge 2 ] || {
				log "$1 needs a value"
				exit 2
			}
			case "$1" in
			--clients) clients=$2 ;;
			--duration) duration=$2 ;;
			--warmup) warmup=$2 ;;
			--rounds) rounds=$2 ;;
			--settle-max) settle_max=$2 ;;
			esac
			shift 2
			;;
		*)
			log "unknown scale flag $1"
			exit 2
			;;
		esac
	done
	SEED_CACHE=${SEED_CACHE:-/var/tmp/idemkv-bench-seeds}
	mkdir -p "$SEED_CACHE"
	build_idemkv
	nodes=() points=()
	local started
	started=$(now)
	for n in ${counts//,/ }; do
		scale_point "$n"
	done
	out=${BENCH_OUT:-$here/results}
	"$dir/bench" scale-report --out "$out" "${points[@]}"
	log "scale run took $(since "$started"); results in $out/scale.md and $out/scale.json"
}

bench_args=("$@")
install
dir=${BENCH_DIR:-$(mktemp -d /var/tmp/idemkv-bench.XXXXXX)}
mkdir -p "$dir"
log "data dirs in $dir"
if [ "$mode" = scale ]; then
	run_scale "$@"
	exit 0
fi
case "$mode" in
up)
	start_all
	echo "cd $here && go run . $(printf '%q ' "${targets[@]}")"
	echo "export IDEMKV_BENCH_ETCD=$ETCD_ENDPOINTS IDEMKV_BENCH_PG='$PG_DSN' IDEMKV_BENCH_PG_REPLICATED='$PG_SYNC_DSN'"
	log "running; Ctrl-C stops"
	# A foreground sleep would hold the signal until it ends; wait returns at once.
	sleep infinity &
	pids+=($!)
	wait $!
	;;
test)
	start_etcd
	pg_setup
	start_postgres
	start_postgres_sync
	cd "$here"
	IDEMKV_BENCH_ETCD=$ETCD_ENDPOINTS IDEMKV_BENCH_PG=$PG_DSN IDEMKV_BENCH_PG_REPLICATED=$PG_SYNC_DSN go test -race -count=1 ./...
	;;
compare)
	started=$(now)
	build_idemkv
	out=${BENCH_OUT:-$here/results}
	mkdir -p "$out"
	log "load average before measuring: $(uptime | sed 's/.*load average: //')"
	pg_setup
	parts=()
	read -ra backends <<<"$RAFT_LOGS"
	rounds=${ROUNDS:-1}
	systems_total=$(((2 * ${#backends[@]} + 3) * rounds))
	for round in $(seq "$rounds"); do
		if [ "$round" -gt 1 ]; then
			# Every round starts each system afresh, as the first did.
			rm -rf "$dir"/pg "$dir"/pg-primary "$dir"/pg-s1 "$dir"/pg-s2 "$dir"/etcd-e* "$dir"/idemkv[13]-*
		fi
		[ "$rounds" = 1 ] || log "round $round of $rounds"
		floors_due=1
		for be in $RAFT_LOGS; do alone idemkv_alone 3 "$be"; done
		alone postgres_sync_alone
		for be in $RAFT_LOGS; do alone idemkv_alone 1 "$be"; done
		alone postgres_alone
		alone etcd_alone
	done
	"$dir/bench" report --out "$out" "${parts[@]}"
	log "load average after measuring: $(uptime | sed 's/.*load average: //')"
	log "comparison took $(since "$started"); results in $out/results.md, results.json and throughput.png"
	;;
esac
