#!/bin/bash
# The packages recipes/gpu/pusht.sh (and any recipe that stitches: imageio-ffmpeg) needs on the device (no internet
# there; Python 3.12, x86-64), packed here into git-ignored .gpu/ small enough to travel with the repo in ONE call
# (repo ~28 MB + 31 MB < 64 MiB): .gpu/pylib.tar.xz (gym-pusht, gymnasium, farama-notifications, pymunk and cffi,
# pygame, shapely, imageio-ffmpeg without its binary: what `import gym_pusht` and tasks/pushtworld.py import and the
# device's image lacks; it has opencv-python-headless and cloudpickle), .gpu/ffmpeg.xz (imageio-ffmpeg's ffmpeg, xz'd:
# 21 MB against 80), and .gpu/setup.sh, which a device command sources first (unpacks into /tmp/gpu, sets PYTHONPATH,
# IMAGEIO_FFMPEG_EXE and SDL_VIDEODRIVER=dummy). The same versions as requirements-dev.txt installs here.
# Run from anywhere: bash recipes/gpu/pusht_wheels.sh; then run(carry [".gpu"]) `source .gpu/setup.sh; ...`
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
work=$(mktemp -d); mkdir -p .gpu
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_24_x86_64 -d "$work/wheels" gym-pusht==0.1.8 gymnasium==1.4.0 farama-notifications==0.0.6 \
    pymunk==6.11.1 cffi==2.0.0 pycparser pygame==2.6.1 shapely==2.2.0 imageio-ffmpeg==0.6.0
python3 -m pip install -q --no-deps --no-compile --target "$work/pylib" "$work"/wheels/*.whl \
    --python-version 3.12 --only-binary=:all: --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64
xz -T2 -6 -c "$work"/pylib/imageio_ffmpeg/binaries/ffmpeg-* > .gpu/ffmpeg.xz
rm -rf "$work"/pylib/imageio_ffmpeg/binaries/ffmpeg-* "$work"/pylib/pygame/{docs,examples,tests} "$work"/pylib/bin
tar -cf - -C "$work" pylib | xz -T2 -6 > .gpu/pylib.tar.xz
cat > .gpu/setup.sh <<'SH'
mkdir -p /tmp/gpu && tar -xJf .gpu/pylib.tar.xz -C /tmp/gpu && xz -dc .gpu/ffmpeg.xz > /tmp/gpu/ffmpeg && chmod +x /tmp/gpu/ffmpeg
export PYTHONPATH=/tmp/gpu/pylib${PYTHONPATH:+:$PYTHONPATH} IMAGEIO_FFMPEG_EXE=/tmp/gpu/ffmpeg SDL_VIDEODRIVER=dummy
SH
rm -rf "$work"; du -sh .gpu/pylib.tar.xz .gpu/ffmpeg.xz
