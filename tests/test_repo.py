"""The repository stands alone: no tracked file sends the reader to a folder a user's clone does not have, and every
docs/*.md that a tracked file cites exists; tests run in an empty folder and leave torch's settings as they found
them. How the modules are laid out and import one another: tests/test_layout.py.

What a reader needs from the specs and reference data we developed against lives in docs/ and tests/data/.
"""
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
