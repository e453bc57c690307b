"""The repository stands alone: no tracked file sends the reader to a folder a user's clone does not have, and every
docs/*.md that a tracked file cites exists. Its modules import one another downward: no cycle, no function imports
one of ours (optional third-party dependencies may be imported where they are used), and benchmarks/ is imported by
nothing outside it.

What a reader needs from the specs and reference data we developed against lives in docs/ and tests/data/.
"""
import ast
import glob
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
SHARED = "shared"  # the patterns are assembled from pieces so that this file does not match itself
OUTSIDE = ("../" + SHARED, "/work/" + SHARED, SHARED + "/specs", SHARED + "/reference")


def repo_files():
    """Relative paths of the repository's files: git's tracked files in a checkout, else (an unpacked archive) every
    file outside caches and run outputs."""
    if os.path.exists(os.path.join(ROOT, ".git")):
        names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return names.decode().split("\0")
    skip = {"__pycache__", ".pytest_cache", "out", "data", ".whl", ".gpu"}
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip]  # pruned in place: os.walk does not descend into them
        found += [os.path.relpath(os.path.join(folder, name), ROOT) for name in files]
    return found


def tracked_text_files():
    """(path relative to the repo root, text) of every repository file that is text (binary files are skipped)."""
    for rel in repo_files():
        path = os.path.join(ROOT, rel)
        if not rel or not os.path.isfile(path):  # deleted in the work tree, or a submodule
            continue
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:  # git's own binary heuristic
            continue
        try:
            yield rel, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def test_no_tracked_file_points_outside_the_repo():
    hits = [f"{rel}:{n}: {line.strip()[:140]}" for rel, text in tracked_text_files()
            for n, line in enumerate(text.splitlines(), start=1) if any(p in line for p in OUTSIDE)]
    assert not hits, (f"{len(hits)} line(s) point outside the repository; move what the reader needs into docs/ "
                      "(or tests/data/) and cite that:\n" + "\n".join(hits))


def test_cited_docs_exist():
    missing = [f"{rel}:{n}: {doc}" for rel, text in tracked_text_files()
               for n, line in enumerate(text.splitlines(), start=1)
               for doc in re.findall(r"\bdocs/[\w.-]+\.md\b", line) if not os.path.isfile(os.path.join(ROOT, doc))]
    assert not missing, "cited docs that do not exist:\n" + "\n".join(missing)


def test_tests_run_in_an_empty_directory_outside_the_checkout():
    """conftest.empty_cwd: a checkout's out/ (from `python train.py`) or data/ never changes a test's result."""
    assert os.path.realpath(os.getcwd()) != os.path.realpath(ROOT) and os.listdir(os.getcwd()) == []


PACKAGES = ("base", "nets", "clips", "engine")  # the library's layers, bottom up (README's file map)


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
    assert len(calls) == 1 and calls[0].startswith("nets/family.py:"), calls


def test_torch_settings_a_test_changes_are_put_back():
    """conftest's autouse fixture: dynamo's config (a key set, a key deleted, which makes dynamo say it "does not
    exist") and the process-wide torch settings return to what they were, so no test depends on the order."""
    import torch
    import torch._dynamo.config

    from conftest import restore_torch_settings, torch_settings
    saved = torch_settings()
    limit, dtype, threads = torch._dynamo.config.recompile_limit, torch.get_default_dtype(), torch.get_num_threads()
    torch._dynamo.config.fail_on_recompile_limit_hit = not torch._dynamo.config.fail_on_recompile_limit_hit
    del torch._dynamo.config.recompile_limit
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(threads + 1)
    restore_torch_settings(saved)
    assert torch._dynamo.config.recompile_limit == limit and torch_settings() == saved
    assert (torch.get_default_dtype(), torch.get_num_threads()) == (dtype, threads)
