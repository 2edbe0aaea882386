#!/bin/bash
# Continue the republished shapes comparison on this machine, from this tracked copy when its
# working folder is gone (a new machine, a restart): bash resume.sh [WORK]
#   WORK: the working folder (default /work/shapes_v2); FROZEN: the frozen commit's worktree
#   (default /work/frozen).  Stop it with SIGTERM; run it again to continue.
# The frozen commit is one of main's: a tag or a side branch does not survive a new checkout
# (the first frozen commit, 8f97c8a, was lost so; README.md says how each successor was checked).
set -e
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=${1:-/work/shapes_v2}
frozen=${FROZEN:-/work/frozen}
commit=23e3b3e
if [ ! -d "$frozen" ]; then
    git -C "$repo" worktree add --detach "$frozen" "$commit"
fi
at=$(git -C "$frozen" rev-parse --short=7 HEAD)
if [ "$at" != "$commit" ]; then
    echo "error: $frozen is at $at, not the frozen commit $commit: remove it (git worktree remove)" >&2
    exit 2
fi
if [ ! -f "$work/plan.json" ]; then  # docs/compare.md's recovery: plan, state, splits, runs
    mkdir -p "$work"
    cp -r "$here/plan.json" "$here/state.json" "$here/splits" "$here/runs" "$work/"
fi
if [ -d "$here/baselines" ] && [ ! -d "$work/baselines" ]; then  # measured once, not again
    cp -r "$here/baselines" "$work/"
fi
echo "$(date -u '+%F %T') resume at $(git -C "$frozen" rev-parse --short HEAD) into $work"
PYTHONPATH="$frozen" TF_CPP_MIN_LOG_LEVEL=3 exec caco-compare --trials 3 --seeds 5 --epochs 12 \
    --linear-epochs 30 --few-label-epochs 100 --out "$work"
