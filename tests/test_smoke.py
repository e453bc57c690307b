"""smoke.py, the README's second command: every criterion passes on the tiny Predict2, Predict2.5 and multi-view nets."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import smoke  # noqa: E402


@pytest.mark.parametrize("config", ["tiny", "p25-tiny", "p25-tiny-agibot"])
def test_smoke_passes(config, capsys):
    assert smoke.main(["--config", config, "--grpo-group-size", "2", "--grpo-num-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("SMOKE PASS") and "[FAIL]" not in out
    if config == "p25-tiny-agibot":  # 3 views x 3 latent frames stacked on time, scored as a 2x2 grid of 64x64 views
        assert "latent (16, 9, 8, 8)" in out and "video (2, 3, 9, 128, 128)" in out
