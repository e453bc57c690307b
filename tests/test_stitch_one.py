"""stitch.py --layout one: the first camera alone over the whole frame, in a grid folder (tests/test_stitch.py has the
grid and views layouts and the helpers used here)."""
import json
import os

import pytest

import stitch
from test_stitch import VIEW_SIZE, decode_rgb, manifest, read_code, stitched_views


def test_layout_one_is_the_first_camera_alone_filling_the_frame_in_a_grid_folder(tmp_path):
    """--layout one: videos/<stem>.mp4 (a grid folder's names, read by GridClips) whose every frame is camera ext_1
    over the whole --size, aligned and strided as the grid's cells are; the recipe says so (another hash)."""
    src, _, _ = stitched_views(cameras=False)
    out = str(tmp_path / "one")
    summary = stitch.stitch(src, out, size=f"{VIEW_SIZE[0]}x{VIEW_SIZE[1]}", frames=9, stride=2, workers=1,
                            layout="one")
    assert (summary["written"], summary["by_reason"]) == (2, {"too_short": 1})
    with open(os.path.join(out, "RECIPE.json")) as f:
        assert json.load(f)["layout"] == "one"
    for stem, rec in manifest(out).items():
        assert "views" not in rec and rec["sha1"] == stitch.sha1_file(os.path.join(out, "videos", stem + ".mp4"))
        frames = decode_rgb(os.path.join(out, "videos", stem + ".mp4"), *VIEW_SIZE)
        codes = [read_code(f) for f in frames]  # the whole frame is camera 1 (ext_1): no grid, no black quadrant
        assert len(frames) == rec["n_out"] == (rec["src_len"] - 1) // 2 + 1
        assert all(c["camera"] == 1 and c["episode"] == rec["episode_index"] for c in codes), codes
        assert [c["frame"] for c in codes] == [2 * j for j in range(len(frames))]
    with pytest.raises(ValueError, match="--layout views only"):
        stitch.make_config({"layout": "one", "camera_params": "none"})
    with pytest.raises(ValueError, match="expected --layout grid, views, one"):
        stitch.make_config({"layout": "single"})
