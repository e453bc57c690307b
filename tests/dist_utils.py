"""run_dist(fn, ws, timeout, *args): fn(rank, ws, *args) in ws spawned gloo processes; returns [result per rank].

A rank that raises, or a job that outlives `timeout` (a hang: ranks diverged), fails the test instead of blocking CI.
fn must be a module-level function (spawn pickles it by name) and its result picklable.
"""
import datetime
import io
import os
import queue
import socket
import time
import traceback

import torch
import torch.multiprocessing as mp


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, ws, port, fn, args, results):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ws, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=120))
    try:
        buf = io.BytesIO()  # serialised: tensors sent as shared-memory fds would vanish when this process exits
        torch.save(fn(rank, ws, *args), buf)
        results.put((rank, "ok", buf.getvalue()))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def run_dist(fn, ws=2, timeout=120, *args):
    ctx = mp.get_context("spawn")
    results_queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, ws, port, fn, args, results_queue)) for r in range(ws)]
    for p in procs:
        p.start()
    results = {}
    try:
        deadline = time.time() + timeout
        for _ in range(ws):
            try:
                rank, status, value = results_queue.get(timeout=max(1, deadline - time.time()))
            except queue.Empty:
                raise AssertionError(f"timed out after {timeout}s; ranks {sorted(set(range(ws)) - set(results))}"
                                     " never finished (a hang: did the ranks diverge?)") from None
            if status != "ok":
                raise AssertionError(f"rank {rank} raised:\n{value}")
            results[rank] = torch.load(io.BytesIO(value), weights_only=False)  # our own child's data
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(ws)]
