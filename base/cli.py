"""Command lines from dataclasses: the one mechanism every script uses.

    @dataclass
    class Config:
        lr: float = 1e-4  # peak learning rate                 <- this comment is the flag's --help text
        betas: tuple = (0.9, 0.999)  # AdamW betas              <- --betas 0.9,0.95
        grpo: GRPOConfig = field(default_factory=GRPOConfig)  # <- --grpo-<each of its fields>

    given = cli.parse_flags(Config, argv, description=__doc__)   # only the flags really passed
    cfg = cli.build(Config, preset, given)                         # defaults < preset < given

Every field is a flag `--field-name` (underscores become dashes), booleans are `--x` / `--no-x`, tuples take
comma-separated values, and a nested dataclass field contributes its own fields under its name as prefix.
Unknown flags are an error (one line naming the closest valid flags), and so are unknown keys in a preset. The help
text of a flag is the comment on its field's line plus any comment-only lines right below it (so a header comment for
the next fields goes after a blank line), with the default appended (unless the comment speaks of its default itself).
A preset is a recipe file (recipes/*.py, nanoGPT's config/*.py): plain assignments `name = value` of fields, read
by `read_recipe` (a shipped one by `recipe(name)`).
`cli.main(fn)` runs a script's main and turns a user error (a bad flag, a missing file) into one line on stderr
and exit code 2, instead of a traceback; NANOCOSMOS_TRACEBACK=1 shows the traceback too.
"""
import argparse
import dataclasses
import difflib
import functools
import importlib
import inspect
import io
import json
import os
import re
import sys
import textwrap
import tokenize
import traceback
import typing


@functools.cache
def field_help(cls) -> dict:
    """{field name: help text} from the comments beside (and continuing below) each field of a dataclass; a field
    its class does not comment (inherited, e.g. rl.RLConfig's) takes its base class's comment."""
    helps = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        helps.update(own_field_help(klass))
    return helps


def own_field_help(cls) -> dict:
    """{field name: help text} of the fields written in cls's own body."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments, code_rows = {}, set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):  # tokens: a '#' inside a string is no comment
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_rows.add(tok.start[0])
    lines = source.splitlines()
    helps = {}
    for row, line in enumerate(lines, start=1):
        m = re.match(r"^    (\w+)\s*:", line)  # a field of the class body (dedented: four spaces)
        if not m or row not in comments:
            continue
        text = [comments[row]]
        below = row + 1
        while below in comments and below not in code_rows:  # comment-only lines continue the field's comment
            text.append(comments[below])
            below += 1
        helps[m.group(1)] = " ".join(text).replace("%", "%%")  # argparse formats help with %
    return helps


def _fields(cls):
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]


def _default(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _parse_item(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def tuple_type(example):
    """argparse type for a tuple flag: comma-separated, elements typed like the default's (numbers when empty)."""
    kind = type(example[0]) if example else None

    def parse(text):
        if text.strip() in ("", "()"):
            return ()
        items = [s.strip() for s in text.split(",")]
        try:
            return tuple(kind(s) if kind is not None else _parse_item(s) for s in items)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got {text!r}")
    parse.__name__ = "comma-separated list"
    return parse


def _show(value):
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "(empty)"
    return repr(value) if isinstance(value, str) else str(value)


def add_fields(parser, cls, prefix="", positional=()):
    """Add one flag per field of dataclass `cls` (recursing into nested dataclasses with `name_` as prefix)."""
    helps = field_help(cls)
    for f, kind in _fields(cls):
        name, default = prefix + f.name, _default(f)
        if dataclasses.is_dataclass(kind):
            group = parser.add_argument_group(f"--{name.replace('_', '-')}-*: {helps.get(f.name, kind.__name__)}")
            add_fields(group, kind, prefix=name + "_")
            continue
        text = helps.get(f.name, "")
        many = name in positional and (kind is tuple or typing.get_origin(kind) is tuple)  # RUN [RUN ...]: required
        if default is not dataclasses.MISSING and "default" not in text.lower() and not many:  # a comment may explain
            text += f" (default: {_show(default)})"
        if name in positional:  # a tuple field takes one or more values, others one
            parser.add_argument(name, help=text, **(dict(nargs="+") if many else {} if default is dataclasses.MISSING
                                                    else dict(nargs="?", default=argparse.SUPPRESS)))
            continue
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, help=text)
        elif kind is tuple or typing.get_origin(kind) is tuple:
            parser.add_argument(flag, dest=name, type=tuple_type(default or ()), help=text, metavar="A,B,...")
        else:
            parser.add_argument(flag, dest=name, type=kind, help=text, metavar=kind.__name__.upper())


def _nest(cls, flat, prefix=""):
    """Flat argparse names (grpo_lr) -> nested dicts ({"grpo": {"lr": ...}}) following the dataclass tree."""
    out = {}
    for f, kind in _fields(cls):
        name = prefix + f.name
        if dataclasses.is_dataclass(kind):
            sub = _nest(kind, flat, name + "_")
            if sub:
                out[f.name] = sub
        elif name in flat:
            out[f.name] = flat[name]
    return out


def parse_flags(cls, argv, description=None, positional=(), prog=None):
    """The flags really given on the command line, as a (nested) dict of field values. Unknown flags: an error."""
    # allow_abbrev=False: `--step 10` is an unknown flag, not a silent `--steps 10` (nor `--strid` for `--stride`)
    parser = argparse.ArgumentParser(prog=prog, description=description, argument_default=argparse.SUPPRESS,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    add_fields(parser, cls, positional=positional)
    known, unknown = parser.parse_known_args(argv)
    if unknown:  # one line with the closest flags, not argparse's ~45 lines of usage
        flags = parser._option_string_actions  # every --flag (and --no-flag) spelling
        parser.exit(2, f"{parser.prog}: error: {unknown_flags(unknown, flags, parser.prog)}\n")
    flat = vars(known)
    return _nest(cls, {k: tuple(v) if isinstance(v, list) else v for k, v in flat.items()})  # nargs="+" gives lists


def unknown_flags(args: list, flags, prog: str) -> str:
    """The one-line error for arguments argparse did not know: each unknown flag with the closest valid ones
    (difflib), and where the full list is."""
    bad = [a.split("=", 1)[0] for a in args if a.startswith("-")]
    if not bad:
        return f"unexpected argument(s) {' '.join(args)}; `python {prog} --help` says what {prog} takes"
    hints = []
    for name in bad:
        close = difflib.get_close_matches(name.replace("_", "-"), sorted(flags), n=2, cutoff=0.6)
        hints.append(f"{name} (did you mean {' or '.join(close)}?)" if close else f"{name} (no flag is close)")
    return f"unknown flag{'s' * (len(bad) > 1)} {', '.join(hints)}; `python {prog} --help` lists every flag"


def differences(old: dict, new: dict, skip=()) -> str:
    """"key old -> new, ..." for the keys whose values differ (a missing key shows as null), long values shortened:
    what a refusal to mix two settings prints instead of both whole dicts."""
    def short(value):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 48 else text[:45] + "..."
    keys = sorted((set(old) | set(new)) - set(skip))
    return ", ".join(f"{k} {short(old.get(k))} -> {short(new.get(k))}" for k in keys if old.get(k) != new.get(k))


def build(cls, *layers):
    """The dataclass from its defaults overlaid by each layer (nested dicts, later wins); unknown keys: an error."""
    values = {}
    kinds = dict((f.name, kind) for f, kind in _fields(cls))
    for layer in layers:
        unknown = sorted(set(layer) - set(kinds))
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown key(s) {unknown}; known: {sorted(kinds)}")
        for key, value in layer.items():
            if dataclasses.is_dataclass(kinds[key]) and isinstance(value, dict):
                values.setdefault(key, {}).update(value)
            else:
                values[key] = value
    for key, kind in kinds.items():  # nested layers become their dataclass (its own validation runs)
        if dataclasses.is_dataclass(kind) and isinstance(values.get(key), dict):
            values[key] = build(kind, values[key])
    return cls(**values)


RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")


def read_recipe(path, what="--recipe"):
    """{name: value} of a recipe file's top-level assignments (names starting with "_" aside); a missing file is one
    line naming `what`, the path and the fix."""
    if not os.path.isfile(path):
        raise ValueError(f"{what} {path}: no such file; copy one of {RECIPES} (e.g. tiny.py) and edit it")
    with open(path, encoding="utf-8") as f:
        settings = {}
        exec(compile(f.read(), path, "exec"), {}, settings)  # a preset is data: assignments, no imports needed
    return {k: v for k, v in settings.items() if not k.startswith("_")}


def recipe(name):
    """A shipped recipe: recipes/<name>.py's settings ({} when there is none by that name)."""
    path = os.path.join(RECIPES, name + ".py")
    return read_recipe(path) if os.path.isfile(path) else {}


def merged(*layers):
    """Nested dicts overlaid, later wins (a nested dataclass's dict merged key by key, as build does)."""
    out = {}
    for layer in layers:
        for key, value in layer.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_function(what, module, name):
    """The callable module.name of a plug-in (every `module:function` flag: train.py's --reward, policyeval.py's
    --policies and --judge, a task's); `what` names the flag and term in its one-line errors. The working directory
    is put on sys.path: train.py's own folder may be another one."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # appended: a plug-in must not shadow an installed package for the whole run
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and (module == err.name or module.startswith(err.name + ".")):
            raise ValueError(f"{what}: no module {module!r}: it must be importable from the working "
                             f"directory {cwd} ({module.replace('.', '/')}.py there) or installed") from err
        raise ImportError(f"{what}: importing {module!r} failed: {err}") from err
    if not hasattr(mod, name):
        raise ValueError(f"{what}: module {module!r} ({getattr(mod, '__file__', '?')}) has no "
                         f"function {name!r}")
    fn = getattr(mod, name)
    if not callable(fn):
        raise ValueError(f"{what}: {module}.{name} is a {type(fn).__name__}, not a function")
    return fn


def parse(cls, argv, description=None, positional=(), prog=None):
    """parse_flags + build, for scripts without presets."""
    return build(cls, parse_flags(cls, argv, description, positional, prog))


def flag(name):
    """The command-line spelling of a (possibly nested, dotted or underscored) field name: grpo.kl_coef -> --grpo-kl-coef."""
    return "--" + name.replace(".", "-").replace("_", "-")


def flatten(values, prefix=""):
    """{"grpo": {"lr": 1}} -> {"grpo.lr": 1}: for messages that name every given flag."""
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flatten(value, prefix + key + "."))
        else:
            out[prefix + key] = value
    return out


def subcommand(argv, name, doc, usage):
    """`SCRIPT NAME ...` scripts: the arguments after NAME, or None after printing doc for -h/--help."""
    if argv[:1] == [name]:
        return argv[1:]
    if argv[:1] in (["-h"], ["--help"]):
        print(doc)
        return None
    raise ValueError(f"expected the command `{name}`, got {argv[:1] or 'nothing'}: {usage}")


def main(fn, user_errors=(ValueError, OSError)):
    """Run fn(); a user error becomes one line on stderr and exit code 2 (NANOCOSMOS_TRACEBACK=1: with traceback).
    Ctrl-C where a script does not handle it (train.py's loop does: it saves first) is one line and exit code 130."""
    prog = os.path.basename(sys.argv[0]) or "nanocosmos"
    try:
        code = fn()
    except user_errors as e:
        if os.environ.get("NANOCOSMOS_TRACEBACK"):
            traceback.print_exc()
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        if os.environ.get("NANOCOSMOS_TRACEBACK"):
            traceback.print_exc()
        print(f"{prog}: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        sys.exit(130)  # the shell's code for SIGINT
    sys.exit(code if isinstance(code, int) else 0)
