#!/usr/bin/env bash
# A study (a preset's grid, or a subset of it) on the GPU machine in one call, its records
# brought back as one archive:
#   bash bench/gpu_study.sh NAME MINUTES ARCHIVE_DIR [dana sweep options...]
# runs `dana sweep --out results/NAME --no-models [options]` for at most MINUTES on
# ${DANA_DEVICE:-cuda} (results/ is ${DANA_RESULTS:-results}, under the checkout unless
# absolute), then packs results/NAME into ARCHIVE_DIR/NAME.tar.gz (a run cut by the time
# limit keeps its checkpoint there). A later call continues where that one stopped: put
# the archive at results/NAME.tar.gz (or leave results/NAME in place) and call again.
# `dana report results/NAME` reads the records like any study's; each run's config.json
# names the device that made it. Needs only python3 with torch (no install):
# the checkout is put on PYTHONPATH. The suite runs a smoke grid with DANA_DEVICE=cpu.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: bash bench/gpu_study.sh NAME MINUTES ARCHIVE_DIR [dana sweep options...]" >&2
    exit 2
fi
name=$1 minutes=$2 archive_dir=$3
shift 3
case $name in
    */* | .* | "") echo "gpu_study: NAME must be a plain folder name, got '$name'" >&2; exit 2 ;;
esac
if ! [[ $minutes =~ ^[0-9]+([.][0-9]+)?$ ]]; then
    echo "gpu_study: MINUTES must be a number, got '$minutes'" >&2
    exit 2
fi
archive_dir=$(mkdir -p "$archive_dir" && cd "$archive_dir" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
results=${DANA_RESULTS:-results}
mkdir -p "$results"
if [ ! -d "$results/$name" ] && [ -f "$results/$name.tar.gz" ]; then
    tar -xzf "$results/$name.tar.gz" -C "$results"
    echo "gpu_study: continuing from $results/$name.tar.gz"
fi
seconds=$(python3 -c "print(max(1, int(float('$minutes') * 60)))")
status=0
timeout --signal=INT --kill-after=30 "$seconds" \
    python3 -m dana.cli sweep --out "$results/$name" --device "${DANA_DEVICE:-cuda}" \
    --no-models --quiet "$@" || status=$?
if [ "$status" -eq 124 ]; then
    echo "gpu_study: stopped after $minutes minutes; the same call continues it"
fi
mkdir -p "$results/$name"  # (stopped before the sweep began: an empty archive)
tmp="$archive_dir/.$name.tar.gz.tmp"
tar -czf "$tmp" -C "$results" "$name"
mv "$tmp" "$archive_dir/$name.tar.gz"
echo "gpu_study: records in $archive_dir/$name.tar.gz ($(du -h "$archive_dir/$name.tar.gz" | cut -f1))"
# 124: the time limit (the archive holds what was done); anything else is the sweep's own
[ "$status" -eq 124 ] && exit 0
exit "$status"
