"""Files written so that a kill never leaves half of one: atomic writes and directory fsyncs, a file's sha1, and the
exclusive lock one process holds on a run's folder. A leaf every writer can import (stitch.py's manifests, the run
directory, the latent cache)."""
import errno
import fcntl
import hashlib
import os
import socket


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, text):
    """tmp + fsync + rename + fsync(dir): the file is either the old one or complete, never truncated. text: str
    (written as UTF-8, newlines untranslated) or bytes."""
    tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic: a reader sees the old or the new content, never a truncated file
    fsync_dir(os.path.dirname(path) or ".")


def sha1_file(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def claim(path, refusal, wait=False):
    """An exclusive lock on `path` while the returned file is open, or ValueError(refusal.format(holder=...)) (wait:
    block instead). lockf, not flock: fork children (DataLoader workers, which notice a dead parent only every ~5 s)
    do not inherit it, so it dies with this process. Per process: a second claim here succeeds, and closing any other
    handle of `path` here would release it."""
    handle = open(path, "a+")
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            handle.close()
            raise
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ValueError(refusal.format(holder=holder)) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle
