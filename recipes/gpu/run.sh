#!/bin/bash
# The one entry point of the device recipes: each recipes/gpu/NAME.sh is named by what it measures, its header says
# what it runs, how long it takes and what it writes into $OUT (the folder whose files come back).
#   OUT=/tmp/out bash recipes/gpu/run.sh                          # lists the recipes
#   OUT=/tmp/out bash recipes/gpu/run.sh grpo_14b_fast 1          # runs recipes/gpu/grpo_14b_fast.sh 1
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ $# -eq 0 ] || [ ! -f "$here/$1.sh" ] || [ "$1" = run ] || [ "$1" = env ] || [ "$1" = device ]; then
    [ $# -gt 0 ] && echo "recipes/gpu/run.sh: no recipe ${1@Q}" >&2
    echo "recipes (OUT=DIR bash recipes/gpu/run.sh NAME [ARGS]):" >&2
    for f in "$here"/*.sh; do
        name=$(basename "$f" .sh)
        [ "$name" = run ] || [ "$name" = env ] || [ "$name" = device ] || printf '  %-28s %s\n' "$name" "$(sed -n 2p "$f" | cut -c3-110)" >&2
    done
    exit 2
fi
: "${OUT:?OUT must name a folder for the results}"
name=$1; shift
exec bash "$here/$name.sh" "$@"
