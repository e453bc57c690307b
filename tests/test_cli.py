"""base/cli.py: one command-line mechanism for every script: flags from dataclass fields, help from their comments."""
import argparse
import dataclasses
import sys
from dataclasses import dataclass, field

import pytest

import bench
import ckpt
import export
import sample
import smoke
import stitch
import t5
import train
import vae_bench
from base import cli
from grpo import GRPOConfig


@dataclass
class Toy:
    lr: float = 1e-4  # peak learning rate, 100% of it

    # a header comment (after a blank line) is not a field's help
    flag: bool = False  # switch it on
    # and this continues the help of flag
    name: str = "x#y"  # a name with a hash inside the string
    betas: tuple = (0.9, 0.999)  # two floats
    steps: tuple = ()  # any ints
    grpo: GRPOConfig = field(default_factory=GRPOConfig)  # the GRPO knobs


def test_flags_types_nesting_and_presets():
    given = cli.parse_flags(Toy, ["--lr", "3", "--no-flag", "--betas", "0.8,0.95", "--steps", "1,2",
                                  "--grpo-kl-coef", "0.1", "--grpo-window-size", "2", "--grpo-window-range", "0,5"])
    assert given == {"lr": 3.0, "flag": False, "betas": (0.8, 0.95), "steps": (1, 2),
                     "grpo": {"kl_coef": 0.1, "window_size": 2, "window_range": (0, 5)}}
    cfg = cli.build(Toy, {"lr": 5.0, "name": "preset", "grpo": {"kl_coef": 0.5, "lr": 3e-4}}, given)
    assert (cfg.lr, cfg.name, cfg.betas, cfg.steps) == (3.0, "preset", (0.8, 0.95), (1, 2))  # given beats preset
    assert (cfg.grpo.kl_coef, cfg.grpo.lr, cfg.grpo.window_range) == (0.1, 3e-4, (0, 5))  # merged per field
    assert cli.flatten({"grpo": {"kl_coef": 1}, "lr": 2}) == {"grpo.kl_coef": 1, "lr": 2}
    assert cli.flag("grpo.kl_coef") == "--grpo-kl-coef"
    with pytest.raises(SystemExit):
        cli.parse_flags(Toy, ["--no-such-flag", "1"])
    with pytest.raises(SystemExit):
        cli.parse_flags(Toy, ["--betas", "a,b"])
    with pytest.raises(ValueError, match="unknown key"):
        cli.build(Toy, {"lrr": 1})
    with pytest.raises(ValueError, match="window_size"):  # the nested dataclass validates itself
        cli.build(Toy, {"grpo": {"window_size": 99}})


def test_help_comes_from_the_field_comments():
    helps = cli.field_help(Toy)
    assert helps["lr"] == "peak learning rate, 100%% of it"  # escaped for argparse's % formatting
    assert helps["flag"] == "switch it on and this continues the help of flag"
    assert helps["name"] == "a name with a hash inside the string"
    parser = argparse.ArgumentParser()
    cli.add_fields(parser, Toy)
    text = parser.format_help()
    assert "peak learning rate, 100% of it (default: 0.0001)" in " ".join(text.split())
    assert "--no-flag" in text and "--grpo-kl-coef" in text


@pytest.mark.parametrize("cls", [train.TrainConfig, GRPOConfig, sample.SampleConfig, smoke.SmokeConfig,
                                 bench.BenchConfig, stitch.StitchConfig, t5.T5Config, ckpt.Check, export.Export,
                                 vae_bench.BenchConfig])
def test_every_flag_of_every_script_has_help(cls):
    """`--help` of every script shows each flag's meaning (and its default)."""
    helps = cli.field_help(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not helps.get(f.name)]
    assert not missing, f"{cls.__name__}: fields without a comment (their --help would be empty): {missing}"


def test_abbreviated_flags_are_unknown_flags(capsys):
    """argparse would take `--step 10` as --steps 10 and `--strid` as --stride: here they are errors, like a typo."""
    with pytest.raises(SystemExit):
        cli.parse_flags(Toy, ["--l", "3"])
    with pytest.raises(SystemExit):
        train.parse_config(["--step", "10"])
    with pytest.raises(SystemExit):
        cli.parse_flags(stitch.StitchConfig, ["--strid", "2"])
    assert "unknown flag --strid (did you mean --stride" in capsys.readouterr().err


@pytest.mark.parametrize("cls", [train.TrainConfig, sample.SampleConfig, smoke.SmokeConfig, bench.BenchConfig,
                                 stitch.StitchConfig, t5.T5Config, ckpt.Check, export.Export, vae_bench.BenchConfig])
def test_an_unknown_flag_is_one_line_with_the_closest_flags(cls, capsys):
    """A typo: one line naming the closest valid flags and --help, exit code 2; not ~45 lines of usage."""
    name = max((cli.flag(f.name) for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(f.type)), key=len)
    typo = name[:-2] + name[-1] + name[-2]  # a real flag of this script, its last two letters swapped
    with pytest.raises(SystemExit) as e:
        cli.parse_flags(cls, [typo, "1"], prog="script.py")
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "usage" not in err, err
    assert err.startswith(f"script.py: error: unknown flag {typo} (did you mean ") and f" {name}" in err
    assert err.endswith("?); `python script.py --help` lists every flag\n")


def test_unknown_flags_name_their_closest_matches_and_stray_values(capsys):
    with pytest.raises(SystemExit):
        train.parse_config(["--stpes", "2", "--lora_rank=4"])
    assert capsys.readouterr().err.endswith("error: unknown flags --stpes (did you mean --steps or --eval-steps?), "
                                            "--lora_rank (did you mean --lora or --lora-alpha?); `python "
                                            f"{sys.argv[0].split('/')[-1]} --help` lists every flag\n")
    with pytest.raises(SystemExit):
        cli.parse_flags(stitch.StitchConfig, ["SRC", "OUT", "extra", "--xyzzy"], positional=("src", "out"),
                        prog="stitch.py")
    assert capsys.readouterr().err == ("stitch.py: error: unknown flag --xyzzy (no flag is close); `python stitch.py "
                                       "--help` lists every flag\n")
    with pytest.raises(SystemExit):
        cli.parse_flags(stitch.StitchConfig, ["SRC", "OUT", "extra"], positional=("src", "out"), prog="stitch.py")
    assert capsys.readouterr().err == ("stitch.py: error: unexpected argument(s) extra; `python stitch.py --help` says "
                                       "what stitch.py takes\n")


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    """Outside train.py's loop (which saves first) Ctrl-C ends a script with one line, no traceback."""
    monkeypatch.setattr(sys, "argv", ["sample.py"])

    def interrupted():
        raise KeyboardInterrupt
    with pytest.raises(SystemExit) as e:
        cli.main(interrupted)
    assert e.value.code == 130 and capsys.readouterr().err == "sample.py: interrupted (Ctrl-C)\n"


@dataclass
class Many:
    runs: tuple = ()  # one or more run directories
    clips: int = 4  # how many


def test_a_positional_tuple_takes_one_or_more_values():
    """`SCRIPT RUN [RUN ...]`: a positional tuple field gathers the positional values (before or after the flags)."""
    for argv in (["a", "b", "--clips", "2"], ["--clips", "2", "a", "b"]):
        assert cli.parse_flags(Many, argv, positional=("runs",)) == {"runs": ("a", "b"), "clips": 2}
    assert cli.build(Many, cli.parse_flags(Many, ["a"], positional=("runs",))).runs == ("a",)
    with pytest.raises(SystemExit):  # none given: argparse's usage error
        cli.parse_flags(Many, ["--clips", "2"], positional=("runs",))
    parser = argparse.ArgumentParser()
    cli.add_fields(parser, Many, positional=("runs",))
    assert "one or more run directories\n" in parser.format_help()  # required: no "(default: (empty))"
