import os
import random
import sys
import warnings

import pytest
import torch
import torch._dynamo.config
import torch._inductor.config

# tests import the flat top-level modules (model.py, ckpt.py, ...), the benchmarks (benchmarks/bench.py, ...) and
# the helpers beside them
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
sys.path.insert(0, HERE)


def pytest_collection_modifyitems(config, items):
    """NANOCOSMOS_TEST_ORDER=reverse or random:SEED runs the suite in another order (each xdist worker collects the
    same order), to show that no test depends on another having run before it."""
    order = os.environ.get("NANOCOSMOS_TEST_ORDER", "")
    if order == "reverse":
        items.reverse()
    elif order.startswith("random:"):
        random.Random(int(order.split(":", 1)[1])).shuffle(items)
    elif order:
        raise pytest.UsageError(f"NANOCOSMOS_TEST_ORDER={order!r}: reverse or random:SEED")


# Process-wide torch settings a test (or the code it runs in-process: engine/build.py's --compile sets dynamo's recompile
# limit) may change: each is read before every test and put back after it, so no test sees another's settings.
TORCH_CONFIG_MODULES = (torch._dynamo.config, torch._inductor.config)
TORCH_SETTINGS = {
    "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "deterministic algorithms": (lambda: (torch.are_deterministic_algorithms_enabled(),
                                          torch.is_deterministic_algorithms_warn_only_enabled()),
                                 lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    "threads": (torch.get_num_threads, torch.set_num_threads),
    "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
    "float32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "anomaly detection": (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
    "default device": (torch.get_default_device, torch.set_default_device),
    "cuda matmul tf32": (lambda: torch.backends.cuda.matmul.allow_tf32,
                         lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v)),
    "cudnn": (lambda: (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
                       torch.backends.cudnn.deterministic),
              lambda v: [setattr(torch.backends.cudnn, k, x) for k, x in zip(("allow_tf32", "benchmark",
                                                                               "deterministic"), v)]),
}


def torch_settings():
    """({config module: {key: value}}, {setting: value}) of the process's torch settings now."""
    return ({m: m.get_config_copy() for m in TORCH_CONFIG_MODULES},
            {name: get() for name, (get, _) in TORCH_SETTINGS.items()})


def restore_torch_settings(saved):
    """Put back every setting that differs from `saved`; a config key deleted since (its module then says it "does
    not exist") is set again, which makes it exist."""
    configs, settings = saved
    with warnings.catch_warnings():  # reading a deprecated key warns; it is only compared
        warnings.simplefilter("ignore", FutureWarning)
        for module, before in configs.items():
            restore_config(module, before)
    for name, (get, put) in TORCH_SETTINGS.items():
        if get() != settings[name]:
            put(settings[name])


def restore_config(module, before):
    now = module.get_config_copy()  # a deleted key may still be listed here: hasattr tells
    for key, value in before.items():
        if key not in now or now[key] != value or not hasattr(module, key):
            setattr(module, key, value)


@pytest.fixture(autouse=True)
def torch_global_settings():
    """Every test starts from the settings the one before it started from, whatever it or its code changed."""
    saved = torch_settings()
    yield
    restore_torch_settings(saved)


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
    from clips import tiny
    root = str(tmp_path_factory.mktemp("data") / "tiny_grid")
    tiny.make_tiny_dataset(root)
    return root


@pytest.fixture(scope="session")
def tiny_action_grid(tmp_path_factory):
    """train.py's tiny-action data: make_synthetic(motion="actions") episodes stitched as the preset stitches them,
    once for the session (read, never written: test_action_world, test_policyeval)."""
    from clips import tiny
    root = str(tmp_path_factory.mktemp("data") / "tiny_action_grid")
    tiny.make_tiny_dataset(root, actions=True)
    return root
