import os
import sys

import pytest

# tests import the flat top-level modules (model.py, ckpt.py, ...), the benchmarks (benchmarks/bench.py, ...) and
# the helpers beside them
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
sys.path.insert(0, HERE)


@pytest.fixture(autouse=True)
def empty_cwd(tmp_path_factory, monkeypatch):
    """Every test runs in an empty directory of its own: what a checkout's out/, data/ or sample.mp4 holds (after a
    `python train.py`, say) never changes a result, and a default relative path (--out out, sample.mp4) is never
    written into the checkout. Paths into the repo go through ROOT / __file__."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(scope="session")
def tiny_grid(tmp_path_factory):
    """train.py's tiny default data (2x2 grids of synthetic LeRobot episodes), stitched once for the session: read,
    never written, by the train.py and sample.py runs of several files."""
    import train
    root = str(tmp_path_factory.mktemp("data") / "tiny_grid")
    train.make_tiny_dataset(root)
    return root
