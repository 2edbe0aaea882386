#!/bin/bash
# Continue the republished shapes comparison on this machine, from this tracked copy when its
# working folder is gone (a new machine, a restart): bash resume.sh [WORK]
#   WORK: the working folder (default /work/shapes_v2); FROZEN: the frozen commit's worktree
#   (default /work/frozen).  Stop it with SIGTERM; run it again to continue.
set -e
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=${1:-/work/shapes_v2}
frozen=${FROZEN:-/work/frozen}
if [ ! -d "$frozen" ]; then  # the commit the plan names (plan.json "commit")
    git -C "$repo" worktree add --detach "$frozen" shapes-comparison-frozen 2>/dev/null \
        || git -C "$repo" worktree add --detach "$frozen" comparison-frozen
fi
if [ ! -f "$work/plan.json" ]; then  # docs/compare.md's recovery: plan, state, splits, runs
    mkdir -p "$work"
    cp -r "$here/plan.json" "$here/state.json" "$here/splits" "$here/runs" "$work/"
fi
echo "$(date -u '+%F %T') resume at $(git -C "$frozen" rev-parse --short HEAD) into $work"
PYTHONPATH="$frozen" TF_CPP_MIN_LOG_LEVEL=3 exec caco-compare --trials 3 --seeds 5 --epochs 12 \
    --linear-epochs 30 --few-label-epochs 100 --out "$work"
