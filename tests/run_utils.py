"""in_process(module, argv): a script's main(argv) run in this process the way `python <module>.py argv` runs it
(under cli.main), returned as a subprocess.CompletedProcess (returncode, stdout, stderr), so a test reads it like a
real run (step_rows reads its metrics; rerun_last_step makes a resume test's pair). script(argv, torchrun=N): the real thing, a subprocess (torchrun with N ranks if N). script_beside(argv):
that subprocess started in the background, so that an independent in-process run uses the second core meanwhile.

In-process saves importing torch and the repo (~4.5 s of one core per run, ~50 runs in the suite). It matches the
subprocesses it replaces: one intra-op thread (their OMP_NUM_THREADS=1, so a run compares bit for bit with a killed
subprocess run), and what train.py changes in the process is put back: the global RNG, the SIGTERM/SIGUSR1/SIGINT handlers,
sys.argv[0]. A failed run's --out lock is closed (it sits in a reference cycle of the traceback until collected).
What needs its own process stays a subprocess: kill -9, signals, torchrun ranks, one real command line per script.
"""
import contextlib
import gc
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_process(module, argv):
    import ckpt
    from base import cli
    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    threads, prog = torch.get_num_threads(), sys.argv[0]
    torch.set_num_threads(1)
    sys.argv[0] = module.__file__  # "train.py: error: ..." as from the script
    code = None
    try:
        with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main(lambda: module.main(list(argv)),
                     user_errors=getattr(module, "USER_ERRORS", (ValueError, OSError, ckpt.CheckpointError)))
    except SystemExit as e:
        code = e.code
    finally:
        torch.set_num_threads(threads)
        sys.argv[0] = prog
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if code:
        gc.collect()
    return subprocess.CompletedProcess([module.__name__ + ".py", *argv], code, out.getvalue(), err.getvalue())


def script(argv, torchrun=0, name="train.py", env=None, timeout=600):
    """`python name argv`, or under torchrun with `torchrun` gloo ranks; one thread per process."""
    cmd = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun}"]
                              if torchrun else [])
    return subprocess.run(cmd + [os.path.join(ROOT, name), *map(str, argv)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))


def script_beside(argv, name="train.py", env=None):
    """`python name argv` started now, one thread, while this process goes on with other work (an in-process run:
    on 2 cores each gets one); .result(timeout) waits and returns what script() would have. Its output goes to
    temporary files, not pipes: a long run's progress bars would fill a pipe nobody reads yet and stall it."""
    cmd = [sys.executable, os.path.join(ROOT, name), *map(str, argv)]
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))

    def result(timeout=600):
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            timed_out = True
        text = []
        for f in (out, err):
            f.seek(0)
            text.append(f.read())
            f.close()
        if timed_out:
            raise AssertionError(f"{name} {' '.join(map(str, argv))} timed out after {timeout}s:\n{text[0][-3000:]}\n"
                                 f"{text[1][-3000:]}")
        return subprocess.CompletedProcess(cmd[1:], proc.returncode, *text)
    proc.result = result
    return proc


def check(proc):
    """proc, or an AssertionError with the command and the end of its output."""
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, proc.args[-30:]))} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def step_rows(out):
    """{step: row} of a run's metrics.jsonl (a step logged twice: its last row)."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return {row["step"]: row for row in map(json.loads, f)}


def rerun_last_step(module, args, root, steps):
    """(ref, resumed): `module` run with args (which save every step up to `steps`) into ROOT/ref, then a copy of it
    without its last checkpoint, `latest` pointing at the one before, resumed into ROOT/resumed: a resume test
    compares the two at `steps`."""
    ref, resumed = os.path.join(root, "ref"), os.path.join(root, "resumed")
    check(in_process(module, args + ["--out", ref]))
    shutil.copytree(ref, resumed)
    shutil.rmtree(os.path.join(resumed, f"step_{steps:08d}"))
    with open(os.path.join(resumed, "latest"), "w") as f:
        f.write(f"step_{steps - 1:08d}\n")
    check(in_process(module, args + ["--out", resumed]))
    return ref, resumed


def suggested(message):
    """The commands a one-line error suggests (`python X.py ARGS` or `python DIR/X.py ARGS` in backticks), as
    [(module name, argv)], so a test can run each and see that the fix it names works."""
    import re
    import shlex
    found = re.finditer(r"`python (?:\w+/)?(\w+)\.py ?([^`]*)`", message)
    return [(m.group(1), shlex.split(m.group(2))) for m in found]
