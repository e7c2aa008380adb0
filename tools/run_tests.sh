#!/usr/bin/env bash
# Run the test suite inside the environment made by tools/setup_env.sh.
# Extra arguments go to pytest (e.g. `bash tools/run_tests.sh tests/attention -x`).
# Exits non-zero when a test fails, and also when no test was collected
# (pytest's exit code 5), so a broken collection never looks green.
set -uo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CMT_AQR_HOME="${CMT_AQR_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/cmt-aqr}"
PY="${CMT_AQR_VENV:-$CMT_AQR_HOME/venv}/bin/python"
[[ -x "$PY" ]] || { echo "no environment at $PY: run 'make setup' (bash tools/setup_env.sh) first" >&2; exit 1; }
cd "$REPO_ROOT"
start=$(date +%s)
# The whole suite unless a test path is given (e.g. tests/attention or tests/x.py::test_y). The whole suite runs in
# parallel pytest-xdist workers, one per core up to 4 (CMT_AQR_TEST_WORKERS overrides; 1 runs in this process), one
# test at a time per worker (--maxschedchunk 1) so that the slow tests, which tests/conftest.py orders first, spread
# over the workers; tests/conftest.py splits the cores between the workers' torch threads.
paths=(tests)
for arg in "$@"; do
    [[ "$arg" == tests* ]] && paths=()
done
cores=$(nproc)
workers="${CMT_AQR_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}"
parallel=()
if [[ ${#paths[@]} -gt 0 && "$workers" -gt 1 ]]; then
    parallel=(-n "$workers" --maxschedchunk 1)
    echo "running the test suite in $workers pytest-xdist workers (CMT_AQR_TEST_WORKERS=1: one process)"
fi
"$PY" -m pytest "${paths[@]}" "${parallel[@]}" -q -ra --durations=15 "$@"
rc=$?
echo "test suite finished in $(( $(date +%s) - start ))s (pytest exit code $rc)"
if [[ $rc -eq 5 ]]; then
    echo "pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
exit $rc
