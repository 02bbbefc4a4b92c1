#!/usr/bin/env bash
# make test's pytest on a small machine: the Ray tests (marker `ray`: they share one local
# Ray and one Serve port, tests/ray_session.py, so they run in one session) and all the
# other tests run as two pytest sessions side by side, each with its own temp folder.
# The Ray tests spend much of their time waiting on actors and HTTP, so the rest runs in
# that time. The Ray session's output is printed after the other's; the exit status is
# the first non-zero of the two.
# Usage: scripts/pytest_split.sh PYTHON [pytest args for both sessions]
set -u
py=${1:?usage: scripts/pytest_split.sh PYTHON [pytest args]}
shift
mkdir -p build
log=build/pytest-ray.log
"$py" -m pytest -q -m ray --basetemp=build/pytest-ray -p no:cacheprovider "$@" >"$log" 2>&1 &
ray_pid=$!
"$py" -m pytest -q -m "not ray" --basetemp=build/pytest-rest "$@"
rest=$?
wait "$ray_pid"
ray=$?
echo "---------------------------------------- the Ray tests (pytest -m ray)"
cat "$log"
if [ "$rest" -ne 0 ]; then exit "$rest"; fi
exit "$ray"
