#!/usr/bin/env bash
# Runs one phase of a make target and says so: its name first, then how long it took.
# Usage: scripts/phase.sh NAME [NOTE] -- COMMAND [ARGS...]
set -uo pipefail
name=$1
shift
note=""
if [ "$1" != "--" ]; then
    note=" ($1)"
    shift
fi
shift  # the --
echo "==> $name$note" >&2
start=$(date +%s)
"$@"
status=$?
elapsed=$(( $(date +%s) - start ))
if [ "$status" -eq 0 ]; then
    echo "==> $name: done in ${elapsed} s" >&2
else
    echo "==> $name: FAILED (exit $status) after ${elapsed} s" >&2
fi
exit "$status"
