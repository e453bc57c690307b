# Sourced first by every recipes/gpu/*.sh: strict variables, the repo root, $OUT (the folder whose files come back),
# unbuffered logs, imageio-ffmpeg (the device lacks it: recipes/gpu/pusht_wheels.sh packs it into .gpu/ with
# setup.sh, carried as ".gpu"; refused in one line when missing, not left to fail at the first mp4), and the card.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
: "${OUT:?OUT must name a folder for the results}"
export PYTHONUNBUFFERED=1
if [ -z "${IMAGEIO_FFMPEG_EXE:-}" ]; then
    [ -f .gpu/setup.sh ] || { echo "recipes/gpu: .gpu/setup.sh is missing: run bash recipes/gpu/pusht_wheels.sh here," \
                                   "then carry .gpu" >&2; exit 2; }
    source .gpu/setup.sh
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
