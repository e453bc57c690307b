"""The docs name only what exists: every file path and every `module.name` that README.md, docs/*.md and the
library's docstrings name resolves to a file of the repository and a function, class or constant of that module.

A path is a word ending in .py, .md or .sh (resolved from the repository root, or from docs/ for a doc's sibling); a
`module.name` is a word whose module part is one of ours (a top-level file's stem, a folder's module as `engine/rl`
or `rl`) followed by a name: a top-level def, class or assignment of that module, or Class.attribute. Words that
name a variable, not a module (`vae.decode` on a VAE object), are listed in OBJECTS with why.
"""
import ast
import functools
import glob
import os
import re

from test_layout import BENCHMARKS, library_modules, modules
from test_repo import ROOT, tracked_text_files


@functools.cache
def repo_files():
    return frozenset(rel for rel, _ in tracked_text_files())

PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:py|md|sh))(?![\w/])")
DOTTED = re.compile(r"(?<![\w/.])((?:[a-z]+/)?[a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_]\w*)?)")
# stems that the docs also use for an object of that kind (its method, not the module's function)
OBJECTS = {"vae", "net", "data", "run", "cfg", "sampler", "rollout", "optimizer", "model", "cache", "text"}
# files a doc names that live elsewhere: the project's specs and upstream's (diffusers) by their bare name
ELSEWHERE = {"predict25.md", "infra.md", "pipeline_cosmos2_5_predict.py", "mymod.py"}  # and a user's plug-in
OURS = {"base", "nets", "clips", "engine", "tasks", "benchmarks", "recipes", "tests", "docs", "data"}  # top folders
EXTENSIONS = {"py", "md", "sh", "json", "jsonl", "txt", "mp4", "png", "pt", "pth", "safetensors", "lock", "log",
              "parquet", "csv", "yaml", "npz", "gz", "tgz", "whl", "html"}


@functools.cache
def module_symbols():
    """{short name: {module path: top-level names, Class.attr, and the fields of its classes (with those of their
    bases of ours: a config key such as grpo.kl_coef)}} of the library's and benchmarks/ modules."""
    found, fields, bases = {}, {}, {}
    for path in {**library_modules(), **modules(BENCHMARKS)}.values():  # every class's own fields and bases
        with open(path, encoding="utf-8") as f:
            for node in ast.walk(ast.parse(f.read(), path)):
                if isinstance(node, ast.ClassDef):
                    fields.setdefault(node.name, set()).update(
                        n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
                    bases.setdefault(node.name, set()).update(b.id for b in node.bases if isinstance(b, ast.Name))

    def all_fields(cls, seen=()):
        return set().union(fields.get(cls, set()), *(all_fields(b, seen + (cls,)) for b in bases.get(cls, ())
                                                     if b not in seen))
    for name, path in {**library_modules(), **modules(BENCHMARKS)}.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        names = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                if isinstance(node, ast.ClassDef):
                    names |= all_fields(node.name)
                    names |= {f"{node.name}.{n.name}" for n in node.body if isinstance(n, (ast.FunctionDef,
                                                                                             ast.AsyncFunctionDef))}
                    names |= {f"{node.name}.{t.id}" for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                              for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                              if isinstance(t, ast.Name)}
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names |= {t.id for t in ast.walk(target) if isinstance(t, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):  # a name a module re-exports counts as its own
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        rel = os.path.relpath(path, ROOT)[:-3]
        for short in {rel, name.split(".")[-1]}:
            found.setdefault(short, {})[rel] = names
    return found


def texts():
    """(where, text) of README.md, docs/*.md and every library module's docstrings."""
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        with open(path, encoding="utf-8") as f:
            yield os.path.relpath(path, ROOT), f.read()
    for name, path in {**library_modules(), **modules(BENCHMARKS)}.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    yield f"{os.path.relpath(path, ROOT)}:{getattr(node, 'lineno', 1)}", doc


def stale_references(sources=None):
    """["where: what"] of the references in sources ((where, text); default: texts()) that do not resolve."""
    files = repo_files()
    symbols, stale = module_symbols(), []
    for where, text in sources or texts():
        for path in PATH.findall(text):
            if path in ELSEWHERE or ("/" in path and path.split("/")[0] not in OURS):
                continue  # a spec's, or upstream's (cosmos_predict2/..., droid/..., examples/...)
            candidates = {path, os.path.join("docs", path), os.path.join("tests", path), os.path.join("recipes", path)}
            if not candidates & files and not any(f.endswith("/" + path) for f in files):
                stale.append(f"{where}: file {path}")
        for module, attr in DOTTED.findall(text):
            if module in OBJECTS or module not in symbols or attr.split(".")[0] in EXTENSIONS:
                continue
            first = attr.split(".")[0]  # Class.member: the member must exist when the class lists its members
            if not any(attr in names or (first in names and not any(n.startswith(first + ".") for n in names))
                       for names in symbols[module].values()):
                stale.append(f"{where}: {module}.{attr}")
    return stale


def test_the_docs_name_only_files_and_functions_that_exist():
    stale = stale_references()
    assert not stale, f"{len(stale)} references to what does not exist (fix the text or the name):\n" + "\n".join(stale)


def test_the_reference_check_finds_what_is_gone():
    """The check itself: a moved function, a deleted file and a missing method are found; what exists is not."""
    gone = "docs/" + "nope.md"  # built, so that tests/test_repo.py's own check of cited docs does not read it
    text = ("`train.TINY` moved; " + gone + " was deleted; rl.Scoring.nope never was; but rl.Scoring.decode, "
            "grpo.kl_coef (a config key), docs/rl.md, recipes/tiny.py and rl.md (a sibling) exist; vae.decode is a VAE's")
    assert stale_references([("probe", text)]) == [f"probe: file {gone}", "probe: train.TINY",
                                                   "probe: rl.Scoring.nope"]
