"""tests/check_reference_p25.py's bookkeeping on a small UniPC grid file cut from the CI subset (tests/data/
flow_ref.safetensors): grids pass, a wrong sigma fails, a tensor it does not account for and a missing nets/flow.py
function are failures, never skipped."""
import json
import os

import check_reference_p25
import pytest
import torch
from safetensors.torch import load_file, save_file

from nets import flow

REF = load_file(os.path.join(os.path.dirname(__file__), "data", "flow_ref.safetensors"))
GRIDS = ("shift5_N4", "karras_N8")


def write_unipc_file(tmp_path, extra=None):
    tensors = {k[len("unipc."):]: v for k, v in REF.items()
               if any(k.startswith(f"unipc.grid.{g}.") for g in GRIDS)}
    tensors.update(extra or {})
    save_file(tensors, str(tmp_path / "p25_unipc_ref.safetensors"))
    (tmp_path / "p25_unipc_ref.json").write_text(json.dumps({}))
    return str(tmp_path / "p25_unipc_ref.json")


def failures(results):
    return [label for label, err, bound in results if not err <= bound]


def test_grids_pass_and_every_tensor_is_compared(tmp_path):
    results = check_reference_p25.check_file(write_unipc_file(tmp_path))
    assert len(results) == 2 * len(GRIDS) and failures(results) == []


def test_a_wrong_sigma_fails(tmp_path):
    sigmas = REF["unipc.grid.shift5_N4.sigmas_fp32"].clone()
    sigmas[1] += 3e-7  # above the 1e-7 bound
    results = check_reference_p25.check_file(write_unipc_file(tmp_path, {"grid.shift5_N4.sigmas_fp32": sigmas}))
    assert failures(results) == ["grid.shift5_N4.sigmas_fp32"]


def test_an_unknown_tensor_is_a_failure(tmp_path):
    results = check_reference_p25.check_file(write_unipc_file(tmp_path, {"orders_table": torch.zeros(3)}))
    assert failures(results) == ["orders_table: not accounted for by this checker"]


def test_a_missing_flow_function_is_a_failure(tmp_path, monkeypatch):
    monkeypatch.delattr(flow, "unipc")
    results = check_reference_p25.check_file(write_unipc_file(tmp_path))
    assert failures(results) == ["flow.unipc does not exist"]


def test_an_unknown_file_is_refused(tmp_path):
    (tmp_path / "p25_other_ref.json").write_text("{}")
    with pytest.raises(ValueError, match="p25_other_ref.json"):
        check_reference_p25.check_file(str(tmp_path / "p25_other_ref.json"))
