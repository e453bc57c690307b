"""Robot actions and states beside the stitched videos (issue 36): stitch.py writes them per episode with this module,
and actionclips.ActionClips / ViewActionClips return each clip's action chunk aligned to its frames (FolderActions
reads them). No torch and no clips/data.py here: stitch.py's worker processes import it. docs/data.md shows the layout.

Written by `stitch.py SRC OUT` (--layout grid or views alike) when the LeRobot dataset has an `action` feature:
  OUT/actions/<stem>.npz  action [n-1, stride, A] float32: row j holds the commands of source rows j*stride ..
                          (j+1)*stride - 1, those executed between output frame j (source row j*stride) and output
                          frame j+1 (LeRobot's action of row i is issued at frame i; its effect shows from frame i+1
                          on); state [n, S] observation.state at the kept frames (S = 0 without one); frame_index [n]
                          the source rows kept (j*stride); success [1] float32 (1 or 0) where the dataset has
                          next.success or next.reward (episode_success). n is the video's frame count (manifest n_out).
  OUT/action_stats.json   per feature (action, observation.state): mean, std, min, max (one per dim) and count, and
                          where they come from: the dataset's meta/stats.json (v2.0, v3.0), else its
                          meta/episodes_stats.jsonl pooled over its episodes (v2.1), else computed from actions/*.npz.
  manifest.jsonl          each record gains "actions": {"action_dim", "state_dim", "bytes"}.
A dataset without `action` is said once and stitched exactly as before: no actions/, no action_stats.json, the same
records.

A clip of T frames from start (FolderActions.chunk) gets
  action [T-1, stride*A]: transitions start .. start+T-2, each one's stride commands PACKED (concatenated in source
    order; not summed, not subsampled: nothing between two kept frames is lost; at stride 1 this is upstream's [T-1, A]
    Bridge layout), normalised per dim with the folder's mean and std (a dim with std 0 is only centred);
  state [T, S] at the clip's frames, normalised the same way.
An action network takes the chunk flattened, so its action_dim must be (T-1) * stride * A (check_action_dim).

Contents, top to bottom: writing (stitch.py) -> statistics -> reading (FolderActions).
"""
import hashlib
import json
import os
import zipfile

import numpy as np
import torch
import pyarrow as pa

from base.files import write_atomic
from base.lerobot import BadParquet, read_jsonl, read_parquet
from base.video import ClipError

ACTION, STATE = "action", "observation.state"
SUCCESS, REWARD = "next.success", "next.reward"  # LeRobot's per-frame outcome columns (gym-pusht's, aloha's, ...)
STATS_FILE = "action_stats.json"
STAT_KEYS = ("mean", "std", "min", "max")

# ---------------------------------------------------------------------------------------------- writing (stitch.py)


def feature_dims(source) -> dict:
    """{action: A[, observation.state: S]} from the dataset's info.json features; {} when it has no `action`."""
    dims = {}
    for key in (ACTION, STATE):
        shape = source.features[key].get("shape") if key in source.features else None
        if shape is not None and (len(shape) != 1 or int(shape[0]) < 1):
            raise ValueError(f"{source.root}/meta/info.json: feature {key!r} has shape {shape}, expected one vector "
                             "[dims]; stitch.py writes vector actions and states only")
        dims.update({key: int(shape[0])} if shape is not None else {})
    return dims if ACTION in dims else {}


def plan(source) -> tuple:
    """(dims, statistics from the dataset's metadata or None, the start-up line) for stitch(); a malformed statistics
    file is a ValueError here, before any work."""
    dims = feature_dims(source)
    if not dims:
        return {}, None, (f"stitch: actions: NONE ({source.root} has no `action` feature): videos only, stitched as "
                          "before (no actions/, no action_stats.json)")
    stats = dataset_stats(source.root, dims)
    state = f" and {STATE} [{dims[STATE]}]" if STATE in dims else f" (no {STATE})"
    key = success_key(source)
    success = f"; each episode's success flag from {key}" if key else f"; no {SUCCESS} or {REWARD}: no success flags"
    return dims, stats, (f"stitch: actions: {ACTION} [{dims[ACTION]}]{state} of every source row -> actions/<stem>.npz"
                         f", statistics {stats['source'] if stats else 'computed from them'} -> {STATS_FILE}{success}")


def success_key(source):
    """The column an episode's success is read from: next.success, else next.reward, else None."""
    return next((key for key in (SUCCESS, REWARD) if key in source.features), None)


def episode_success(ep, source):
    """The episode's success flag (the policy objective's return, docs/policy.md): any row's next.success true, else
    any row's next.reward >= 1 (LeRobot's simulated datasets, gym-pusht's and aloha's, give 1 at success); None
    when the dataset has neither column. ValueError naming the file for a column of the wrong length or NaN."""
    key = success_key(source)
    if key is None:
        return None
    filters = [("episode_index", "=", ep.index)] if source.layout == "v3" else None
    column = read_parquet(ep.data_path, columns=[key], filters=filters)[key].combine_chunks()
    if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type):
        column = column.flatten()
    values = column.to_numpy(zero_copy_only=False).astype(np.float64)
    if len(values) != ep.length or not np.isfinite(values).all():
        raise ValueError(f"{ep.data_path}: column {key} of episode {ep.index} is not {ep.length} finite values "
                         f"(one a frame); got {len(values)}")
    return bool((values >= 1).any() if key == REWARD else (values > 0).any())


def action_file(out: str, stem: str) -> str:
    return os.path.join(out, "actions", stem + ".npz")


def read_columns(ep, source, dims: dict) -> dict:
    """key -> [length, dims] float32 of one episode's frame table, in frame_index order; ValueError naming the file
    and column for a wrong width, a missing row, or NaN/Inf."""
    filters = [("episode_index", "=", ep.index)] if source.layout == "v3" else None  # v3 files hold many episodes
    absent = [key for key in dims if key not in read_parquet(ep.data_path, schema=True).names]
    if absent:  # a whole file without the column: pyarrow's "no match for FieldRef" is no damage to re-download
        raise ValueError(f"{ep.data_path}: episode {ep.index}'s frame table has no {' or '.join(absent)} column, "
                         "though meta/info.json lists the feature: this episode's file was written without it (re-"
                         "export it with its actions, or stitch the other episodes: it is skipped)")
    table = read_parquet(ep.data_path, columns=["frame_index", *dims], filters=filters)
    if not np.array_equal(table["frame_index"].to_numpy(), np.arange(ep.length)):
        raise ValueError(f"{ep.data_path}: episode {ep.index}'s frame_index is not 0..{ep.length - 1}")
    values = {}
    for key, width in dims.items():
        column = table[key].combine_chunks()
        flat = column.flatten().to_numpy(zero_copy_only=False) if pa.types.is_list(column.type) or \
            pa.types.is_fixed_size_list(column.type) else np.zeros(0)
        if flat.size != ep.length * width or column.null_count:
            raise ValueError(f"{ep.data_path}: column {key} of episode {ep.index} is not {ep.length} rows of {width} "
                             f"values (info.json's shape); got type {column.type}, {flat.size} values")
        values[key] = flat.astype(np.float32).reshape(ep.length, width)
        bad = np.flatnonzero(~np.isfinite(values[key]).all(1))
        if len(bad):
            raise ValueError(f"{ep.data_path}: column {key} of episode {ep.index} holds NaN/Inf (row {bad[0]})")
    return values


def write_episode(out: str, stem: str, ep, source, dims: dict, stride: int, n: int) -> tuple:
    """Write actions/<stem>.npz for an episode whose video kept n frames (source rows 0, stride, ...): (its manifest
    entry, None), or (None, (reason, detail)) for stitch.py's skips: bad_action (read_columns), bad_parquet."""
    try:
        values, success = read_columns(ep, source, dims), episode_success(ep, source)
    except ValueError as e:  # BadParquet is a ValueError too
        return None, ("bad_parquet" if isinstance(e, BadParquet) else "bad_action", str(e))
    rows = np.arange(n - 1)[:, None] * stride + np.arange(stride)  # [n-1, stride]: transition j's source rows
    kept = np.arange(n) * stride
    if n > 1 and rows[-1, -1] >= ep.length:  # the video holds more frames than the rows can explain
        return None, ("bad_action", f"{ep.data_path}: {n} output frames at stride {stride} need {rows[-1, -1] + 1} "
                                    f"rows of actions, episode {ep.index} has {ep.length}")
    state = values[STATE][kept] if STATE in values else np.zeros((n, 0), np.float32)
    path = action_file(out, stem)
    with open(path + ".tmp", "wb") as f:
        np.savez(f, action=values[ACTION][rows], state=state, frame_index=kept,
                 **({} if success is None else {"success": np.array([float(success)], np.float32)}))
    os.replace(path + ".tmp", path)
    return {"action_dim": dims[ACTION], "state_dim": dims.get(STATE, 0), "bytes": os.path.getsize(path)}, None


def read_arrays(path: str, keys: tuple) -> dict:
    """{key: array} of the keys an .npz holds (an .npy: its one array, as keys[0]), numeric and loaded whole; a
    ValueError naming the file for a damaged archive (a flipped byte fails zip's CRC), an object array (pickled
    Python objects are never loaded) or a non-numeric one, instead of numpy's own error without the file's name."""
    try:
        with open(path, "rb") as f:
            loaded = np.load(f, allow_pickle=False)
            if isinstance(loaded, np.ndarray):
                arrays = {keys[0]: loaded}
            else:
                with loaded:
                    arrays = {k: loaded[k] for k in keys if k in loaded.files}
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as e:  # OSError: not a numpy file; EOF: cut short
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{path}: damaged or not a numpy .npz/.npy file ({type(e).__name__}: {e})") from None
    odd = [f"{k} ({a.dtype})" for k, a in arrays.items() if not np.issubdtype(a.dtype, np.number)]
    if odd:
        raise ValueError(f"{path}: {', '.join(odd)} is not a numeric array; actions are float arrays")
    return arrays


def file_digest(path: str) -> str:
    """The sha256 of a file's bytes, 16 hex digits."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def intact(out: str, rec: dict) -> bool:
    """Whether a manifest record's actions file (if it has one) is there at its recorded size (stitch.py resumes)."""
    path = action_file(out, rec.get("stem", ""))
    return not rec.get("actions") or (os.path.isfile(path) and os.path.getsize(path) == rec["actions"]["bytes"])


# ------------------------------------------------------------------------------------------------------ statistics

def checked_stats(stats: dict, dims: dict, where: str) -> dict:
    """{key: {mean, std, min, max: [dims] floats, count}} for the keys of dims, or a ValueError naming `where`."""
    out = {}
    for key, width in dims.items():
        entry = stats.get(key)
        values = {k: np.asarray(entry.get(k, []), np.float64).reshape(-1) for k in STAT_KEYS} if entry else {}
        if not entry or any(v.shape != (width,) or not np.isfinite(v).all() for v in values.values()) or \
                (values["std"] < 0).any():
            raise ValueError(f"{where}: no usable statistics of {key!r} (need finite mean, std >= 0, min, max of "
                             f"{width} values each); fix or remove the file, and stitch.py computes them instead")
        count = entry.get("count", 0)
        out[key] = {**{k: v.tolist() for k, v in values.items()}, "count": int(np.sum(count))}
    return out


def moments(values: np.ndarray) -> dict:
    """{mean, std, min, max, count} of rows [n, dims] (float64; std the population one, as LeRobot's)."""
    v = values.astype(np.float64)
    return {"mean": v.mean(0).tolist(), "std": v.std(0).tolist(), "min": v.min(0).tolist(), "max": v.max(0).tolist(),
            "count": len(v)}


def pooled(parts: list) -> dict:
    """One feature's statistics over parts (each a moments() of some rows): exact pooled mean and std, from each
    part's count, mean and std alone."""
    n = np.array([p["count"] for p in parts], np.float64)[:, None]
    mean, std = (np.array([p[k] for p in parts], np.float64) for k in ("mean", "std"))
    total = (n * mean).sum(0) / n.sum()
    var = (n * (std ** 2 + mean ** 2)).sum(0) / n.sum() - total ** 2
    return {"mean": total.tolist(), "std": np.sqrt(np.maximum(var, 0)).tolist(),
            "min": np.min([p["min"] for p in parts], 0).tolist(), "max": np.max([p["max"] for p in parts], 0).tolist(),
            "count": int(n.sum())}


def dataset_stats(root: str, dims: dict) -> dict | None:
    """The dataset's own statistics of dims' features: meta/stats.json (v2.0, v3.0), else meta/episodes_stats.jsonl
    pooled over its episodes (v2.1); None: neither."""
    path = os.path.join(root, "meta", "stats.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return {**checked_stats(json.load(f), dims, path), "source": "meta/stats.json"}
    path = os.path.join(root, "meta", "episodes_stats.jsonl")
    if not os.path.isfile(path):
        return None
    episodes = [checked_stats(row.get("stats", {}), dims, f"{path} (episode {row.get('episode_index')})")
                for row in read_jsonl(path)]
    if not episodes or any(e[key]["count"] < 1 for e in episodes for key in dims):
        raise ValueError(f"{path}: pooling needs every episode's count (>= 1) of {sorted(dims)}; fix or remove the "
                         "file, and stitch.py computes the statistics instead")
    return {**{key: pooled([e[key] for e in episodes]) for key in dims},
            "source": f"meta/episodes_stats.jsonl, pooled over {len(episodes)} episodes"}


def write_stats(out: str, dims: dict, stats: dict | None, stems: list):
    """OUT/action_stats.json: the dataset's statistics, or (None) those of the actions/*.npz of `stems` (every
    transition's commands; the states at the kept frames), pooled file by file."""
    if stats is None and stems:
        parts = {key: [] for key in dims}
        for stem in stems:
            f = read_arrays(action_file(out, stem), ("action", "state"))
            rows = {ACTION: f["action"].reshape(-1, dims[ACTION]), STATE: f["state"]}
            for key in dims:  # a 1-frame video has no transition: nothing to pool
                parts[key] += [moments(rows[key])] if len(rows[key]) else []
        stats = {**{key: pooled(p) for key, p in parts.items() if p},
                 "source": f"computed from the {len(stems)} episodes' actions/*.npz"}
    if stats is not None:
        write_atomic(os.path.join(out, STATS_FILE), json.dumps(stats, indent=1))


# --------------------------------------------------------------------------------------------------------- reading

class FolderActions:
    """A stitched folder's actions (the module docstring's layout) for clips of `frames` frames of the videos `stems`:
    their records, widths, stride and statistics, checked once; chunk() gives one clip's chunk. A folder without
    actions, or with actions of two widths, or without action_stats.json or RECIPE.json, is a ValueError; a file
    missing or of another size than its record is in `problems` (stem -> reason: the caller skips that video)."""

    def __init__(self, root: str, stems: list, frames: int, normalize: bool = True):
        self.root, self.frames, self.normalize = root, frames, normalize
        manifest = os.path.join(root, "manifest.jsonl")
        records = {r["stem"]: r.get("actions") for r in read_jsonl(manifest)} if os.path.isfile(manifest) else {}
        lacking = [s for s in stems if not records.get(s)]
        if lacking:
            raise ValueError(f"{root}: {len(lacking)} of {len(stems)} videos have no actions (e.g. {lacking[0]}): "
                             "stitched from a LeRobot dataset without `action`, or by a stitch.py without actions; "
                             "restitch into a new folder: `python stitch.py SRC NEW_OUT ...`")
        widths = {(records[s]["action_dim"], records[s]["state_dim"]) for s in stems}
        stats_path, recipe_path = os.path.join(root, STATS_FILE), os.path.join(root, "RECIPE.json")
        if len(widths) != 1 or not os.path.isfile(stats_path) or not os.path.isfile(recipe_path):
            raise ValueError(f"{root}: action widths {sorted(widths)} (one dataset has one), or {STATS_FILE} or "
                             "RECIPE.json missing: finish the folder with `python stitch.py SRC ROOT` (same options)")
        (self.action_width, self.state_width), = widths
        with open(recipe_path, encoding="utf-8") as f:
            self.stride = int(json.load(f)["stride"])
        with open(stats_path, encoding="utf-8") as f:
            stats = json.load(f)
        dims = {ACTION: self.action_width, **({STATE: self.state_width} if self.state_width else {})}
        self.source = stats.get("source")
        stats = checked_stats(stats, dims, stats_path)
        self.action_scale, self.state_scale = (_scale(stats.get(key), width, normalize) for key, width in
                                               ((ACTION, self.action_width), (STATE, self.state_width)))
        self.problems = {}
        for stem in stems:
            path, size = action_file(root, stem), records[stem]["bytes"]
            have = os.path.getsize(path) if os.path.isfile(path) else None
            if have != size:
                self.problems[stem] = f"missing_file: {path}" if have is None else \
                    f"bytes_mismatch: {path} has {have} bytes, the manifest {size}"

    @property
    def action_dim(self) -> int:
        """What an action network must take: the chunk [frames-1, stride * A] flattened."""
        return (self.frames - 1) * self.stride * self.action_width

    def summary(self) -> str:
        return (f"action [{self.frames - 1}, {self.stride}x{self.action_width}] per {self.frames}-frame clip (an "
                f"action network's action_dim {self.action_dim}), state [{self.frames}, {self.state_width}]"
                + (f"; normalised by {STATS_FILE} ({self.source})" if self.normalize else "; not normalised"))

    def width(self, per_frame: bool = False) -> int:
        """The action_dim a network takes of these clips: the chunk flattened, or (per_frame: Predict2.5's action-chunk
        net) one latent frame's 4 transitions flattened."""
        return 4 * self.stride * self.action_width if per_frame else self.action_dim

    def fingerprint(self, stems: list) -> dict:
        """{"actions": a digest of the action files of `stems` (their bytes: the manifest records only their sizes),
        "action_stats": of action_stats.json}: saved with a run's episodes (engine/rundir.episode_record), so that a
        resume or evaluate.py on edited actions, or under another normalisation, is refused instead of shifting."""
        files = hashlib.sha256()
        for stem in stems:
            path = action_file(self.root, stem)
            files.update(f"{stem}:{file_digest(path) if os.path.isfile(path) else 'missing'};".encode())
        return {"actions": files.hexdigest()[:16], "action_stats": file_digest(os.path.join(self.root, STATS_FILE))}

    def check_action_dim(self, action_dim: int, config: str, init: str = "", per_frame: bool = False):
        """ValueError in one line when a network's action_dim is not what these clips give, naming the fixes that
        work: the --frames (4k+1) and stitch strides whose clips give it, and training a net from scratch (it takes
        its action_dim from the data)."""
        have = self.width(per_frame)
        if action_dim == have:
            return
        T, s, A = self.frames - 1, self.stride, self.action_width
        per = action_dim // A if action_dim % A == 0 else 0  # transitions x stride the net was built for
        options = [(n, per // n) for n in ((4,) if per_frame else range(4, per + 1, 4)) if per and per % n == 0]
        fixes = [f"a folder stitched at --stride {st}" if per_frame else
                 f"--frames {n + 1}" + ("" if st == s else f" on a folder stitched at --stride {st}")
                 for n, st in options[:3]]
        why = f"4 transitions a latent frame x stride {s} x {A}" if per_frame else f"{T} transitions x stride {s} x {A}"
        raise ValueError(f"--config {config}{f' (--init {init})' if init else ''} takes action_dim={action_dim}, the "
                         f"clips of {self.root} give {have} = {why} action values: "
                         + ("; ".join(fixes) + ", or " if fixes else f"no clip of {A}-value commands gives "
                            f"{action_dim} ({action_dim} is not a multiple of {A} x 4 transitions): ")
                         + "train a network from scratch (--init random), which takes its action_dim from the data")

    def chunk(self, stem: str, n: int, start: int) -> tuple:
        """(action [T-1, stride*A], state [T, S]) float32 of the clip start .. start+T-1 of a video of n frames;
        ClipError (bad_action, a counted skip) for a file of other shapes or with NaN/Inf."""
        path, T = action_file(self.root, stem), self.frames
        if not os.path.isfile(path):
            raise ClipError(f"missing_file: {path} (deleted since start-up)")
        try:
            arrays = read_arrays(path, ("action", "state"))
        except ValueError as e:  # a damaged file: a counted skip, as a video that fails to decode
            raise ClipError(f"bad_action: {e}; restitch the episode (delete the file first)") from None
        action, state = arrays.get("action"), arrays.get("state")
        want = ((n - 1, self.stride, self.action_width), (n, self.state_width))
        if action is None or state is None or (action.shape, state.shape) != want:
            raise ClipError(f"bad_action: {path} holds action {getattr(action, 'shape', None)}, state "
                            f"{getattr(state, 'shape', None)}; expected {want[0]}, {want[1]}: restitch the episode")
        if not (np.isfinite(action).all() and np.isfinite(state).all()):
            raise ClipError(f"bad_action: {path} holds NaN/Inf values; restitch the episode (delete the file first)")
        s_mean, s_std = self.state_scale
        chunk = self.normalise(action[start:start + T - 1].reshape((T - 1) * self.stride, self.action_width))
        return chunk, ((state[start:start + T] - s_mean) / s_std).astype(np.float32)

    def raw(self, chunk):
        """normalise's inverse: the network's chunk [..., transitions, stride * A] -> raw actions [..., transitions *
        stride, A] in the dataset's units (what a world-model reward reads)."""
        a_mean, a_std = (torch.as_tensor(v, device=chunk.device) for v in self.action_scale)
        return chunk.float().reshape(*chunk.shape[:-2], -1, self.action_width) * a_std + a_mean

    def normalise(self, raw):
        """Raw actions [..., transitions * stride, A] in the dataset's units -> the network's chunk [..., transitions,
        stride * A] float32, normalised by the folder's statistics: what chunk() gives a clip, and what a policy's
        actions become (engine/world.py)."""
        a_mean, a_std = self.action_scale
        raw = np.asarray(raw)
        if raw.ndim < 2 or raw.shape[-1] != self.action_width or raw.shape[-2] % self.stride:
            raise ValueError(f"raw actions of shape {raw.shape}: the last dim must be {self.root}'s {self.action_width} "
                             f"action values, the one before whole transitions of stride {self.stride}")
        chunk = ((raw - a_mean) / a_std).reshape(*raw.shape[:-2], raw.shape[-2] // self.stride, -1)
        return chunk.astype(np.float32)


def _scale(stats: dict | None, width: int, normalize: bool) -> tuple:
    """(mean, std) per dim; identity without normalisation; a dim with std 0 is only centred."""
    if not normalize or stats is None:
        return np.zeros(width, np.float32), np.ones(width, np.float32)
    std = np.asarray(stats["std"], np.float32)
    return np.asarray(stats["mean"], np.float32), np.where(std > 0, std, 1).astype(np.float32)
