#!/usr/bin/env bash
# Runs every fuzz target of the module for a bounded time each.
#
#   scripts/fuzz.sh                 # every target, FUZZTIME (default 10s) each
#   FUZZTIME=1m scripts/fuzz.sh     # longer
#   scripts/fuzz.sh ./api           # the targets of some packages only
#
# Targets are found by their declaration (func FuzzXxx(f *testing.F)) in *_test.go files,
# so a new target runs without being listed here. A failing input is written by go test
# to the package's testdata/fuzz/<Target>/ directory: commit it as a regression seed
# once the bug is fixed. FUZZ_PARALLEL bounds the fuzzing workers (default 1: the CI
# machine is shared).
set -euo pipefail

cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-10s}"
parallel="${FUZZ_PARALLEL:-1}"

if [ "$#" -gt 0 ]; then
	dirs=("$@")
else
	# The module's own packages; nested modules (bench/) have their own go.mod.
	mapfile -t dirs < <(grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' . |
		grep -v '^./bench/' | xargs -n1 dirname | sort -u)
fi

ran=0
for dir in "${dirs[@]}"; do
	mapfile -t targets < <(grep -hE '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' "$dir"/*_test.go || true)
	for decl in "${targets[@]}"; do
		name="${decl#func }"
		name="${name%%(*}"
		echo "== fuzz $dir $name for $fuzztime"
		go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -parallel "$parallel" "$dir"
		ran=$((ran + 1))
	done
done
if [ "$ran" -eq 0 ]; then
	echo "no fuzz targets found" >&2
	exit 1
fi
echo "== $ran fuzz targets passed"
