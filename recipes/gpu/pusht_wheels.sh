#!/bin/bash
# The wheels recipes/gpu/pusht.sh installs on the device (no internet there; Python 3.12, x86-64), downloaded here
# (git-ignored .gpu/): what `import gym_pusht` and tasks/pushtworld.py truly import and the device's image lacks
# (gym-pusht, gymnasium, farama-notifications, pymunk and its cffi, pygame, shapely: 18 MB in .gpu/pusht; the image
# has opencv-python-headless for gym-pusht's cv2 and cloudpickle), and imageio-ffmpeg (stitch.py's and the judge's
# ffmpeg: 29 MB in .gpu/ffmpeg). The repo (28 MB) and both exceed the 64 MiB a device call carries: carry
# .gpu/ffmpeg in a first call and .gpu/pusht in the second, on the same warm machine (pusht.sh says how).
# Run from anywhere: bash recipes/gpu/pusht_wheels.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
get() {  # get FOLDER NAME==VERSION...
    local dir=$1; shift
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux2010_x86_64 --platform manylinux1_x86_64 -d "$dir" "$@"
}
get .gpu/pusht gym-pusht==0.1.8 gymnasium==1.4.0 farama-notifications==0.0.6 pymunk==6.11.1 cffi==2.0.0 \
    pygame==2.6.1 shapely==2.2.0
get .gpu/ffmpeg imageio-ffmpeg==0.6.0
du -sh .gpu/pusht .gpu/ffmpeg
