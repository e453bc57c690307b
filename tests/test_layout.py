"""The house: how the files are laid out and import one another, tested so that the layout cannot drift.

* Imports go downward: no cycle (counting imports anywhere in a file), none inside a function, benchmarks/ imported by
  nothing outside it; at most MAX_LAYERS modules in the longest chain of imports; and folders are layers too (no
  folder imports a top-level file that imports it back), so the listing reads bottom up (README's map).
* README's file map names every file; at most MAX_TOP top-level .py files; none over MAX_LINES lines.
* One home for the conditioning record: `Condition(` is written in condition.py alone, and a new per-clip input
  reaches the network along every path through the three files docs/conditioning.md names.
* Each model family and each objective is chosen in one place, with the same names in each of its modules.
"""
import ast
import glob
import inspect
import os
import re

from test_repo import ROOT, tracked_text_files

BENCHMARKS = os.path.join(ROOT, "benchmarks")
MAX_LAYERS, MAX_TOP, MAX_LINES = 10, 25, 600


PACKAGES = ("base", "nets", "clips", "engine", "tasks")  # the library's folders (README's file map)


def modules(folder, package=""):
    """{module name: path} of folder's *.py (a top-level or benchmarks/ module is named by its file's stem: the folder
    is on sys.path; a package's by package.stem)."""
    return {package + os.path.basename(f)[:-3]: f for f in sorted(glob.glob(os.path.join(folder, "*.py")))
            if not f.endswith("__init__.py")}


def library_modules():
    """{module: path} of the top-level files and the packages' modules (benchmarks/ aside)."""
    found = modules(ROOT)
    for package in PACKAGES:
        found.update(modules(os.path.join(ROOT, package), package + "."))
    return found


def imported(node, ours):
    """Our modules an import statement names: `import a`, `from pkg import mod`, `from pkg.mod import name`."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in ours]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if node.module in ours:
            return [node.module]
        return [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in ours]
    return []


def own_imports():
    """({module: {our modules it imports anywhere}}, ["file:line: function imports module"]) of the library's modules
    and benchmarks/*.py."""
    files = {**library_modules(), **modules(BENCHMARKS)}
    graph, inside = {}, []
    for name, path in files.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        graph[name] = {m for node in ast.walk(tree) for m in imported(node, files) if m != name}
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside += [f"{os.path.relpath(path, ROOT)}:{node.lineno}: {fn.name} imports {m}"
                           for node in ast.walk(fn) for m in imported(node, files)]
    return graph, sorted(set(inside))


def import_cycles(graph):
    """Each cycle of `graph` once, as [a, b, ..., a] (depth-first: a back edge closes one)."""
    cycles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"
    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_imports_go_downward():
    """Our modules import each other at the top of the file, along a graph without cycles (counting imports anywhere
    in a file), so that what a module needs is visible in its header and none is loaded half-initialised."""
    graph, inside = own_imports()
    assert {"model", "nets.lora", "ckpt", "bench", "peer"} <= set(graph)  # the scan found the modules, benchmarks/ too
    cycles = import_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
    assert not inside, "functions import our modules (import them at the top): " + "; ".join(inside)


def test_library_never_imports_benchmarks():
    """benchmarks/ sits on top of the library: its scripts import the top-level modules, never the other way round,
    so training runs without benchmarks/ on sys.path. No benchmarks/ module takes a top-level module's name (one would
    shadow the other on the tests' sys.path)."""
    library, benchmarks = library_modules(), modules(BENCHMARKS)
    assert {"bench", "benchstep", "peer", "peer_net"} <= set(benchmarks) and "model" in library
    assert not set(library) & set(benchmarks), f"named twice: {sorted(set(library) & set(benchmarks))}"
    graph, _ = own_imports()
    hits = [f"{name}.py imports benchmarks/{m}.py" for name in sorted(library)
            for m in sorted(graph[name] & set(benchmarks))]
    assert not hits, "the library imports a benchmark (move what it needs into the library): " + "; ".join(hits)


# -----------------------------------------------------------------------------
# Layers: the longest chain of imports, and folders as layers


def depths(graph):
    """{module: the number of modules in its longest chain of imports, itself included}."""
    found = {}

    def depth(node):
        if node not in found:
            found[node] = 1 + max((depth(m) for m in graph[node]), default=0)
        return found[node]
    for node in graph:
        depth(node)
    return found


def room(module):
    """What the listing shows a module as: its folder (base, nets, ...; benchmarks/ modules are plain names), or the
    top-level file itself."""
    return "benchmarks" if module in modules(BENCHMARKS) else module.split(".")[0]


def test_import_layers_are_few_and_every_folder_is_a_layer():
    graph, _ = own_imports()
    depth = depths(graph)
    deepest = max(depth, key=depth.get)
    chain = [deepest]
    while graph[chain[-1]]:
        chain.append(max(graph[chain[-1]], key=depth.get))
    assert depth[deepest] <= MAX_LAYERS, f"{depth[deepest]} layers (at most {MAX_LAYERS}): " + " -> ".join(chain)
    rooms = {}
    for module, imports in graph.items():
        rooms.setdefault(room(module), set()).update(room(m) for m in imports if room(m) != room(module))
    cycles = import_cycles(rooms)
    assert not cycles, ("a folder imports a file that imports the folder back (so the listing no longer reads "
                        "bottom up): " + "; ".join(" -> ".join(c) for c in cycles))


# -----------------------------------------------------------------------------
# The listing is the map


def test_the_listing_is_the_map_and_readme_names_every_file():
    files = [rel for rel, _ in tracked_text_files() if rel.endswith(".py")]
    top = [f for f in files if "/" not in f]
    assert len(top) <= MAX_TOP, f"{len(top)} top-level .py files (at most {MAX_TOP}): {top}"
    long = [f"{f}: {n}" for f in files if (n := sum(1 for _ in open(os.path.join(ROOT, f)))) > MAX_LINES]
    assert not long, f"over {MAX_LINES} lines (split by concern): {long}"
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index("## Files"):]
    section = section[:section.index("\n## ", 4)]
    named = set(re.findall(r"`([\w/.-]+\.py)`", section))
    library = [f for f in files if not f.startswith(("tests/", "benchmarks/")) and not f.endswith("__init__.py")]
    missing = [f for f in library + [f for f in files if f.startswith("benchmarks/")] if f not in named]
    assert not missing, f"README's file map does not name {missing}: add a line for each"
    gone = sorted(named - set(files))
    assert not gone, f"README's file map names files that do not exist: {gone}"


MAX_FUNCTION = 80  # lines of one function, its docstring included: one screen, split where a reader would
LONG_FUNCTIONS = {  # not yet split: the p25 action reference generator (its split must regenerate tests/data bit for
    # bit) and test_ckpt's 2-rank job (split, its file would pass 600 lines: it needs a helper file first)
    "tests/check_reference_p25_action.py:main", "tests/test_ckpt.py:_job"}


def test_no_function_is_longer_than_a_screen():
    long = [f"{rel}:{fn.name} ({fn.end_lineno - fn.lineno + 1} lines)" for rel, text in tracked_text_files()
            if rel.endswith(".py") for fn in ast.walk(ast.parse(text, rel))
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION
            and f"{rel}:{fn.name}" not in LONG_FUNCTIONS]
    assert not long, f"functions over {MAX_FUNCTION} lines (split where a reader would): {long}"


# -----------------------------------------------------------------------------
# One home for the conditioning record


def test_the_conditioning_record_is_built_in_condition_py_alone():
    """`Condition(` outside tests/ is written in condition.py only (the class, its builders); elsewhere a record is
    derived (dataclasses.replace, condition.map_tensors), never listed field by field."""
    hits = [f"{rel}:{n}" for rel, text in tracked_text_files() if rel.endswith(".py") and not rel.startswith("tests/")
            and rel != "condition.py" for n, line in enumerate(text.splitlines(), start=1)
            if re.search(r"(^|[^A-Za-z_.])Condition\(", line)]
    assert not hits, "Condition( written outside condition.py (build it there: docs/conditioning.md): " + str(hits)


def test_a_new_per_clip_input_reaches_the_network_along_every_path(tiny_grid, tmp_path, monkeypatch):
    """docs/conditioning.md's recipe, done for a dummy input `probe` in its three places (the data's field, the
    record and from_batch, the network) and nowhere else: the network sees it in SFT steps, the held-out loss, the
    sample videos, RL rollouts and updates (NFT), RL's held-out evaluation and evaluate.py."""
    import dataclasses

    import torch

    import condition
    import evaluate
    import model
    import train
    from clips import data
    from run_utils import check, in_process
    Probe = dataclasses.make_dataclass("Probe", [("probe", torch.Tensor, None)], bases=(condition.Condition,))
    clip, from_batch = data.GridClips._clip, condition.from_batch

    def clip_with_probe(self, video, rng):  # 1. the data: each clip's field (actionclips.py adds its own so)
        return (*clip(self, video, rng), {"probe": torch.tensor([7.0])})

    def from_batch_with_probe(batch, device, *args, **kwargs):  # 2. the record and the one line that reads the batch
        record = from_batch(batch, device, *args, **kwargs)
        return Probe(**{f.name: getattr(record, f.name) for f in dataclasses.fields(record)},
                     probe=batch["probe"].to(device))
    seen, forward = [], model.DiT.forward

    def forward_with_probe(self, x, timesteps, cond):  # 3. the network reads it
        probe = getattr(cond, "probe", None)
        seen.append(None if probe is None else (tuple(probe.shape), float(probe.mean())))
        return forward(self, x, timesteps, cond)
    monkeypatch.setattr(data.GridClips, "_clip", clip_with_probe)
    monkeypatch.setattr(condition, "from_batch", from_batch_with_probe)
    monkeypatch.setattr(model.DiT, "forward", forward_with_probe)
    out, rl_out = str(tmp_path / "sft"), str(tmp_path / "nft")
    check(in_process(train, ["--data", tiny_grid, "--out", out, "--steps", "2", "--save-every", "2",
                             "--sample-every", "2", "--sample-steps", "2"]))
    check(in_process(train, ["--data", tiny_grid, "--out", rl_out, "--init", f"{out}/step_00000002", "--objective",
                             "nft", "--lora", "2", "--steps", "1", "--batch-size", "1", "--nft-group-size", "2",
                             "--nft-num-steps", "2", "--eval-steps", "2", "--sample-every", "0",
                             "--guard-max-ratio", "10"]))
    check(in_process(evaluate, [out, "--steps", "2", "--clips", "1", "--plot", str(tmp_path / "c.png")]))
    assert len(seen) > 20 and all(s is not None and s[1] == 7.0 for s in seen), [s for s in seen if s is None][:3]


# -----------------------------------------------------------------------------
# Each family and each objective chosen in one place


FAMILY_API = ("NAME", "TEXT_ENCODER", "TRAIN_FLAGS", "SAMPLER_FLAGS", "GRIDS", "ROLLOUT_GRID", "sampler_defaults",
              "describe_sampler", "nonfinite_hint", "training_loss", "initial_noise", "initial_state", "sample",
              "rollout_grid", "edm_sigma", "check_step", "predict", "step_mean", "final_x0", "step_sensitivity",
              "training_levels", "forward_velocity")


def test_each_model_family_has_one_home_with_the_same_names_chosen_in_one_place():
    """nets/edm.py (Predict2) and nets/flow.py (Predict2.5) define the same family API with the same parameters; nets/family.family_of
    is the only caller of inits.is_p25, so no module branches on the family itself."""
    import inspect

    from nets import edm, flow
    for name in FAMILY_API:
        a, b = getattr(edm, name), getattr(flow, name)
        if callable(a):
            assert list(inspect.signature(a).parameters) == list(inspect.signature(b).parameters), name
        else:
            assert type(a) is type(b), name
    calls = [f"{rel}:{n}" for rel, text in tracked_text_files() if rel.endswith(".py") and not rel.startswith("tests/")
             for n, line in enumerate(text.splitlines(), start=1) if "is_p25(" in line and "def is_p25" not in line]
    assert calls and all(c.startswith("nets/family.py:") for c in calls), calls


OBJECTIVE_API = ("NAME", "CONFIG", "MAY_CHANGE", "TINY_RECIPES", "validate", "resume_keys", "rewards", "lr_at", "step",
                 "evaluate", "evaluated", "watch", "bar")
OBJECTIVE_FIELDS = ("betas", "weight_decay", "schedule", "guidance", "name", "mfu", "reads_clips", "state",
                    "eval_at_start", "max_psnr_drop", "lr_flag")  # what train.py reads of a built objective


def required(fn):
    """The parameters a caller must pass (a partial's bound ones and defaults aside)."""
    return [p.name for p in inspect.signature(fn).parameters.values() if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def test_each_objective_has_the_same_names_and_is_chosen_in_one_place():
    """sft.SFT, grpo.GRPO, nft.NFT and policy.Policy define the same objective API with the same parameters;
    train.objective_of is the one place --objective is read: nothing else reads a TrainConfig's objective."""
    import grpo
    import nft
    import ownctx
    import policy
    import sft
    import train
    assert train.OBJECTIVES == {"sft": sft.SFT, "grpo": grpo.GRPO, "nft": nft.NFT, "policy": policy.Policy,
                                "ownctx": ownctx.OwnContext}
    classes = list(train.OBJECTIVES.values())
    for name in OBJECTIVE_API + ("__init__",):
        values = [getattr(c, name) for c in classes]
        if callable(values[0]) and name != "CONFIG":
            assert all(required(v) == required(values[0]) for v in values), name
    reads = [f"{rel}:{n}" for rel, text in tracked_text_files() if rel.endswith(".py") and not rel.startswith("tests/")
             for n, line in enumerate(text.splitlines(), start=1) if re.search(r"cfg\.objective\b", line)
             and not (rel == "train.py" and "objective_of(cfg.objective)" in line)]
    assert not reads, "the objective is read outside train.objective_of: " + str(reads)


def test_objectives_are_called_downward_only():
    """No callable crosses a floor upward: train.py hands an objective data (batches, reward terms), never a function
    of its own, and an objective hands engine/ none of its own (the names a reader would give such a hallway)."""
    hallways = ("next_batch", "score=", "decode=", "update=lambda", "timed(", "write_sample=lambda", "held_out=lambda",
                "lambda stop")
    hits = [f"{rel}:{n}: {word}" for rel in ("train.py", "sft.py", "grpo.py", "nft.py", "policy.py", "engine/rl.py",
                                             "engine/objective.py")
            for n, line in enumerate(open(os.path.join(ROOT, rel), encoding="utf-8"), start=1)
            for word in hallways if word in line.split("#")[0]]
    assert not hits, "a callback up a floor: " + "; ".join(hits)
