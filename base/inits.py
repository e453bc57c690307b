"""Each model family's facts (DiT configs, named inits pinned to hub revisions); sources resolved to a path.

DiTConfig is one network's shape and conventions (model.DiT builds it); CONFIGS names each family and size
(get_config, with overrides), config_from_upstream maps an upstream constructor call onto a DiTConfig, is_p25
tells a Predict2.5 net. Each named init is one record (INITS: its pinned URL, the DiT config it loads into,
its sampler grid and conditional-frame timestep); check_init_config and checkpoint_defaults read them. Every
source is resolved or rejected here (ckpt.load and ckpt.py check call resolve_source); base/formats.py then reads
the file and ckpt.py loads it. This module imports no model code: model.py imports DiTConfig from here.
"""
import hashlib
import os
from dataclasses import dataclass, fields, replace

from base.formats import STEP_RE, CheckpointError, denied, weight_map

# -----------------------------------------------------------------------------
# DiT configs: one per model family and size


@dataclass(frozen=True)
class DiTConfig:
    model_channels: int = 64  # D
    num_blocks: int = 2
    num_heads: int = 2
    mlp_ratio: float = 4.0
    in_channels: int = 16  # latent channels, before the condition / padding-mask channels are appended
    out_channels: int = 16
    patch_spatial: int = 2
    patch_temporal: int = 1
    video2world: bool = True  # MinimalV1LVGDiT: one extra input channel marking the conditioning frames
    concat_padding_mask: bool = True
    crossattn_emb_channels: int = 1024  # T5-XXL width
    crossattn_proj_in_channels: int = 1024  # != crossattn_emb_channels adds crossattn_proj (Linear+GELU)
    use_adaln_lora: bool = True
    adaln_lora_dim: int = 256
    max_img_h: int = 240  # RoPE / learnable-pos-emb table sizes, in latent pixels
    max_img_w: int = 240
    max_frames: int = 128
    rope_h_extrapolation_ratio: float = 1.0
    rope_w_extrapolation_ratio: float = 1.0
    rope_t_extrapolation_ratio: float = 1.0
    rope_enable_fps_modulation: bool = False
    extra_per_block_abs_pos_emb: bool = False
    # Predict2.5. Our net always takes t in (0,1); upstream 2.5 nets take 1000*t and multiply by timestep_scale
    # inside, so the field only records which convention a checkpoint was trained with (1 or 0.001, see
    # is_p25; nets/flow.py converts)
    timestep_scale: float = 1.0
    fp32_time_modulation: bool = False  # upstream's "Wan fp32 strategy": t-embedding, adaLN GEMMs, final layer in fp32
    camera_channels: int = 0  # > 0: per-block cam_encoder Linear(camera_channels -> D) (robot/multiview-agibot: 1536)
    # > 0: upstream's ActionConditionedMinimalV1LVGDiT: two MLPs (action_embedder_B_D, action_embedder_B_3D) of the
    # clip's action chunk flattened (Condition.action [B, transitions, dims]: transitions * dims = action_dim), added
    # to the time embedding and to the adaLN-LoRA input (needs use_adaln_lora)
    action_dim: int = 0
    # True: Predict2.5's ActionChunkConditionedMinimalV1LVGDiT: the chunk split per latent frame instead (its
    # action_dim: the actions of one latent frame flattened, 4 x 7 released), each latent frame's embedding added to
    # that frame's time embedding and adaLN-LoRA input, zero for latent frame 0 and on conditioning frames
    action_per_frame: bool = False
    action_hidden_dim: int = 0  # the action MLPs' hidden width (upstream's hidden_dim_in_action_embedder); 0 = 4 x D
    # True (tiny action worlds only, not upstream's): the action embedding is added after t_embedding_norm, not
    # before it, so that its size reaches the blocks (before the norm a command 2x as large gave the same direction:
    # docs/policyeval.md "Why the world model under-moved the square"); the adaLN-LoRA input is unchanged
    action_after_norm: bool = False

    @property
    def head_dim(self):
        return self.model_channels // self.num_heads


_RELEASE = dict(max_img_h=240, max_img_w=240, max_frames=128, use_adaln_lora=True, adaln_lora_dim=256)
CONFIGS = {
    # CPU-fast: tests and the built-in tiny default of train.py / smoke.py
    "tiny": DiTConfig(model_channels=64, num_blocks=2, num_heads=2, adaln_lora_dim=16),
    "tiny-h4": DiTConfig(model_channels=64, num_blocks=2, num_heads=4, adaln_lora_dim=16),  # 4 heads: --cp 4 tests
    "t2i-0.6b": DiTConfig(model_channels=1280, num_blocks=20, num_heads=20, video2world=False, **_RELEASE,
                          rope_h_extrapolation_ratio=4.0, rope_w_extrapolation_ratio=4.0),
    "t2i-2b": DiTConfig(model_channels=2048, num_blocks=28, num_heads=16, video2world=False, **_RELEASE,
                        rope_h_extrapolation_ratio=4.0, rope_w_extrapolation_ratio=4.0),
    "t2i-14b": DiTConfig(model_channels=5120, num_blocks=36, num_heads=40, video2world=False, **_RELEASE,
                         rope_h_extrapolation_ratio=4.0, rope_w_extrapolation_ratio=4.0),
    "v2w-2b": DiTConfig(model_channels=2048, num_blocks=28, num_heads=16, **_RELEASE,
                        rope_h_extrapolation_ratio=3.0, rope_w_extrapolation_ratio=3.0),
    "v2w-14b": DiTConfig(model_channels=5120, num_blocks=36, num_heads=40, **_RELEASE,
                         rope_h_extrapolation_ratio=2.0, rope_w_extrapolation_ratio=2.0,
                         rope_t_extrapolation_ratio=5.0 / 6.0),
}
# Cosmos-Predict2.5 (Reason1 text: 28 layers x 3584 concatenated, projected to 1024); RoPE (h,w,t) = (3,3,1) at 14B too
_P25 = dict(timestep_scale=0.001, fp32_time_modulation=True, rope_h_extrapolation_ratio=3.0,
            rope_w_extrapolation_ratio=3.0)
CONFIGS.update({
    "p25-2b": DiTConfig(model_channels=2048, num_blocks=28, num_heads=16, crossattn_proj_in_channels=100352,
                        **_RELEASE, **_P25),
    "p25-14b": DiTConfig(model_channels=5120, num_blocks=36, num_heads=40, crossattn_proj_in_channels=100352,
                         **_RELEASE, **_P25),
    "p25-2b-agibot": DiTConfig(model_channels=2048, num_blocks=28, num_heads=16, crossattn_proj_in_channels=100352,
                               camera_channels=1536, **_RELEASE, **_P25),
    # CPU-fast stand-ins: text 96 wide (3 fake layers x 32), projected to 32; the camera map keeps its real width
    "p25-tiny": DiTConfig(model_channels=64, num_blocks=2, num_heads=2, adaln_lora_dim=16, crossattn_emb_channels=32,
                          crossattn_proj_in_channels=96, **_P25),
    "p25-tiny-agibot": DiTConfig(model_channels=64, num_blocks=2, num_heads=2, adaln_lora_dim=16,
                                 crossattn_emb_channels=32, crossattn_proj_in_channels=96, camera_channels=1536, **_P25),
})

# Action-conditioned Predict2 (upstream cosmos_predict2/configs/action_conditioned/config.py,
# _PREDICT2_ACTION_CONDITIONED_NET_2B): the v2w-2b network plus the action MLPs; 13 frames (12 transitions) of 7-dim
# Bridge actions (end-effector displacement xyz + rpy, gripper): action_dim = 7 * 12. tiny-action: the tiny default's
# 9-frame clips (8 transitions) at stitch stride 4 of make_synthetic's 2-dim square commands: 8 * 4 * 2.
CONFIGS.update({
    "v2w-2b-action": replace(CONFIGS["v2w-2b"], action_dim=7 * 12),
    "tiny-action": replace(CONFIGS["tiny"], action_dim=8 * 4 * 2),
})
# tiny-action-wide: tiny-action at twice the width (128 channels, 1.45M parameters against 0.53M; about the same CPU time a step at batch 1):
# the tiny-action world's policy evaluation preset (docs/policyeval.md "Why the world model under-moved the square")
CONFIGS["tiny-action-wide"] = replace(CONFIGS["tiny-action"], model_channels=128)
# tiny-action-wide-postnorm: the wide preset with DiTConfig.action_after_norm, measured and not adopted (docs/policyeval.md
# "Levers tried for calibration")
CONFIGS["tiny-action-wide-postnorm"] = replace(CONFIGS["tiny-action-wide"], action_after_norm=True)
# Action-conditioned Predict2.5 (the released robot/action-cond: cosmos_v1_2B_action_chunk_conditioned under the
# experiment cosmos_predict2p5_2B_reason_embeddings_action_conditioned_rectified_flow_bridge_13frame_256x320): p25-2b
# plus the per-latent-frame action MLPs; 13 frames = 1 conditioning + 12 actions of 7 dims, 4 per latent frame (the
# VAE's temporal compression): action_dim = 4 * 7. p25-tiny-action: the tiny-action world's 9-frame clips, 2 latent
# frames after the first, each 4 transitions of stride-4 square commands: 4 * 4 * 2.
CONFIGS.update({
    "p25-2b-action": replace(CONFIGS["p25-2b"], action_dim=4 * 7, action_per_frame=True),
    "p25-tiny-action": replace(CONFIGS["p25-tiny"], action_dim=4 * 4 * 2, action_per_frame=True),
})
# The released action-conditioned 2B (upstream README.md and documentations/setup.md: "post-trained on Bridge",
# 480p, 4 fps; the file name from imaginaire/constants.py get_cosmos_predict2_action_conditioned_checkpoint, its md5
# from scripts/download_checkpoints.py at upstream commit bc864cb). Upstream's downloader pins no revision for this
# repo (REPO_ID_MAPPING lacks it: it downloads the hub's head and checks the md5), so the named init "action-2b" is
# pinned by that md5 instead (NamedInit.md5): a changed file is refused, never loaded.
ACTION_2B_RELEASE = "nvidia/Cosmos-Predict2-2B-Sample-Action-Conditioned/model-480p-4fps.pt"
ACTION_2B_RELEASE_MD5 = "b4db0f266cc487f1242dc09a082c6dd5"

# Upstream constructor kwargs that carry no meaning for this network (rope3d is the only positional scheme;
# the attention backend is a kernel choice; fps bounds and extra_*_extrapolation ratios are unused upstream).
_UPSTREAM_IGNORED = {"pos_emb_cls", "pos_emb_learnable", "pos_emb_interpolation", "atten_backend", "min_fps", "max_fps",
                     "extra_h_extrapolation_ratio", "extra_w_extrapolation_ratio", "extra_t_extrapolation_ratio",
                     "sac_config", "use_crossattn_projection", "use_wan_fp32_strategy"}
_UPSTREAM_CLASSES = {"MiniTrainDIT": (False, 0), "MinimalV1LVGDiT": (True, 0),  # (video2world, camera_channels)
                     "CameraMiniTrainDIT": (False, 1536), "CameraMiniTrainDITwithConditionalMask": (True, 1536),
                     "ActionConditionedMinimalV1LVGDiT": (True, 0),  # their action_dim kwarg is required
                     "ActionChunkConditionedMinimalV1LVGDiT": (True, 0)}
_ACTION_CLASSES = ("ActionConditionedMinimalV1LVGDiT", "ActionChunkConditionedMinimalV1LVGDiT")


def config_from_upstream(class_name, kwargs):
    """Map an upstream constructor call (class name, kwargs) to a DiTConfig; unknown kwargs are an error."""
    name = class_name.rsplit(".", 1)[-1]
    if name not in _UPSTREAM_CLASSES:
        raise ValueError(f"unsupported upstream class {class_name!r}: expected one of {sorted(_UPSTREAM_CLASSES)}")
    ours = {f.name for f in fields(DiTConfig)} - {"video2world", "fp32_time_modulation", "camera_channels",
                                                   "action_per_frame", "action_hidden_dim", "action_after_norm"}
    if ("action_dim" in kwargs) != (name in _ACTION_CLASSES):
        raise ValueError(f"{name}: action_dim is {'missing' if 'action_dim' not in kwargs else 'not a kwarg of it'}"
                         f" (only {' and '.join(_ACTION_CLASSES)} take it, and require it)")
    per_frame, hidden = name == "ActionChunkConditionedMinimalV1LVGDiT", None
    if per_frame:  # its action_dim is one action's: the MLPs take a latent frame's actions, flattened
        kwargs = dict(kwargs)
        hidden = kwargs.pop("hidden_dim_in_action_embedder", None)  # upstream: None = 4 x model_channels
        if hidden is not None:
            if not isinstance(hidden, int) or hidden < 1:
                raise ValueError(f"{name}: hidden_dim_in_action_embedder={hidden!r}: a positive width, or None")
        kwargs.pop("num_action_per_chunk", None)  # upstream pops and ignores it (the count comes from the input)
        ratio = kwargs.pop("temporal_compression_ratio", 4)
        if ratio != 4:  # upstream splits the chunk into num_actions // ratio rows: one per latent frame only at 4
            raise ValueError(f"{name}: temporal_compression_ratio={ratio}: ours is 4 (the VAE's: 4 actions a latent "
                             f"frame); upstream would split 4k actions into 4k/{ratio} rows against k latent frames")
        kwargs["action_dim"] *= ratio
    unknown = set(kwargs) - ours - _UPSTREAM_IGNORED
    if unknown:
        raise ValueError(f"upstream kwargs not understood by DiTConfig: {sorted(unknown)}")
    if kwargs.get("pos_emb_cls", "rope3d") != "rope3d":
        raise ValueError(f"only pos_emb_cls='rope3d' is implemented, got {kwargs['pos_emb_cls']!r}")
    if kwargs.get("timestep_scale", 1.0) not in (1.0, 0.001):
        raise ValueError(f"timestep_scale={kwargs['timestep_scale']!r}: only 1 (Predict2) and 0.001 (Predict2.5)")
    values = {k: v for k, v in kwargs.items() if k in ours}
    emb = values.get("crossattn_emb_channels", 1024)
    values.setdefault("crossattn_proj_in_channels", emb)  # Predict2: a projection exists iff the widths differ
    if kwargs.get("use_crossattn_projection") is False:  # Predict2.5 says it explicitly
        values["crossattn_proj_in_channels"] = emb  # and ignores the in-width without the projection
    elif kwargs.get("use_crossattn_projection") and values["crossattn_proj_in_channels"] == emb:
        raise ValueError(f"use_crossattn_projection with in-width == crossattn_emb_channels ({emb}) is not supported")
    # the class default is True, every release sets it False; keep the class default when the key is absent
    values.setdefault("rope_enable_fps_modulation", True)
    video2world, camera_channels = _UPSTREAM_CLASSES[name]
    return DiTConfig(video2world=video2world, camera_channels=camera_channels, action_per_frame=per_frame,
                     action_hidden_dim=hidden or 0,
                     fp32_time_modulation=bool(kwargs.get("use_wan_fp32_strategy", False)), **values)


def is_p25(cfg):
    """True for a Cosmos-Predict2.5 network (rectified-flow training, Reason1 text, UniPC sampling)."""
    return cfg.timestep_scale == 0.001


def get_config(name, **overrides):
    if name not in CONFIGS:
        raise ValueError(f"unknown DiT config {name!r}; valid: {sorted(CONFIGS)}")
    return replace(CONFIGS[name], **overrides)


# -----------------------------------------------------------------------------
# Named inits

# Released checkpoints (cosmos_dit.md §7.1: flat dicts, `net.` keys, bf16), pinned to the revisions upstream's own
# downloader pins (nvidia-cosmos/cosmos-predict2 scripts/download_checkpoints.py, REPO_ID_MAPPING, commit 877dc68),
# so that every rank and every run reads the same bytes. Cosmos-Predict2.5 (EMA weights, bf16, `net.` keys): pinned
# to the revisions of upstream's own registry (nvidia-cosmos/cosmos-predict2.5
# packages/cosmos-oss/cosmos_oss/checkpoints_predict2.py, release 1.5.0); 2B post-trained is the default of upstream's
# inference, the pre-trained files are what its recipes fine-tune.
# Upstream's per-checkpoint sampler settings (spec §4.2): 2B post-trained samples on the Karras grid with its
# conditional frames at timestep 0.1, agibot (frame-init sampler: shift grid) at 0.1, every other file on the shift
# grid with one timestep for all frames (-1). All Predict2 video2world files of one size share one config
# (docs/predict2.md); load() refuses any config but the record's.


@dataclass(frozen=True)
class NamedInit:
    url: str  # hf://ORG/REPO/FILE@REVISION
    config: str  # the DiT config (CONFIGS) it loads into
    grid: str = "shift"  # the sampler's sigma grid upstream samples it on: shift | karras
    conditional_frame_timestep: float = -1.0  # the conditional frames' timestep (-1: the same as the others')
    md5: str = ""  # the content pin of a file upstream pins no revision for (its downloader checks the same md5)


_REVISIONS = {"2B": "f50c09f5d8ab133a90cac3f4886a6471e9ba3f18", "14B": "03b03a377fede782647afac998f674d9f358e319"}
_V2W = "hf://nvidia/Cosmos-Predict2-{size}-Video2World/model-{res}p-{fps}fps.pt@{rev}"
_P25_2B, _P25_14B = "hf://nvidia/Cosmos-Predict2.5-2B/", "hf://nvidia/Cosmos-Predict2.5-14B/"
P25_2B_POST_UUID = "81edfebe-bd6a-4039-8c1d-737df1a790bf"
INITS = {
    **{f"{size.lower()}-{res}p-{fps}fps": NamedInit(_V2W.format(size=size, res=res, fps=fps, rev=rev),
                                                    f"v2w-{size.lower()}")
       for size, rev in _REVISIONS.items() for res in (480, 720) for fps in (16, 10)},
    "droid": NamedInit("hf://nvidia/Cosmos-Predict2-14B-Sample-GR00T-Dreams-DROID/model-480p-16fps.pt"
                       "@ebc29d30a3fab504bcc779a85bca073d14ad39f9", "v2w-14b"),
    "p25-2b-pre": NamedInit(_P25_2B + "base/pre-trained/d20b7120-df3e-4911-919d-db6e08bad31c_ema_bf16.pt"
                                      "@15a82a2ec231bc318692aa0456a36537c806e7d4", "p25-2b"),
    "p25-2b-post": NamedInit(_P25_2B + f"base/post-trained/{P25_2B_POST_UUID}_ema_bf16.pt"
                                       "@15a82a2ec231bc318692aa0456a36537c806e7d4", "p25-2b", "karras", 0.1),
    "p25-14b-pre": NamedInit(_P25_14B + "base/pre-trained/54937b8c-29de-4f04-862c-e67b04ec41e8_ema_bf16.pt"
                                        "@03eb354f35eae0d6e0c1be3c9f94d8551e125570", "p25-14b"),
    "p25-14b-post": NamedInit(_P25_14B + "base/post-trained/e21d2a49-4747-44c8-ba44-9f6f9243715f_ema_bf16.pt"
                                         "@2bc4ca5ba5a20b9858a7ddb856bc82d70b030fbe", "p25-14b"),
    "p25-2b-agibot": NamedInit(_P25_2B + "robot/multiview-agibot/f740321e-2cd6-4370-bbfe-545f4eca2065_ema_bf16.pt"
                                         "@fbe72c18d152053029a19db3b211cf78671ad422", "p25-2b-agibot", "shift", 0.1),
    "action-2b": NamedInit("hf://" + ACTION_2B_RELEASE, "v2w-2b-action", md5=ACTION_2B_RELEASE_MD5),
}
NAMED_INITS = {name: init.url for name, init in INITS.items()}
INIT_CONFIGS = {name: init.config for name, init in INITS.items()}


def checkpoint_defaults(init, config):
    """(grid, conditional_frame_timestep) upstream uses for the checkpoint `init` in the DiT config `config`."""
    named = INITS.get(init)
    if named is not None and named.config == config:
        return named.grid, named.conditional_frame_timestep
    # Any other source is matched by name: a path or hf:// URL of a released file (a local copy, a mirror) holds no
    # record, so the 2B post-trained file is known by its uuid and agibot by its config (the frame-init sampler is
    # the network's) or its file name; a named init built into another config (which load() refuses) by its URL.
    source = NAMED_INITS.get(init, init)
    post_2b = P25_2B_POST_UUID in source
    agibot = "agibot" in config or "agibot" in source
    return ("karras" if post_2b else "shift"), (0.1 if post_2b or agibot else -1.0)


def resolve_source(init, offline=None):
    """Named init, hf://org/repo/path[@rev], a file or a directory -> a local path. Anything else is an error."""
    init = os.fspath(init)
    if init == "random":
        raise CheckpointError("'random' is not a checkpoint: the caller keeps init_weights() and must not call load")
    named, init = INITS.get(init), NAMED_INITS.get(init, init)
    if init.startswith("hf://"):
        path = _hf_download(init, offline)
        if named is not None and named.md5:
            check_md5(path, named.md5, init)
        return path
    if not os.path.exists(init):
        hint = "" if os.sep in init or "." in init else f" (not a named init either: {sorted(NAMED_INITS)})"
        raise CheckpointError(f"checkpoint not found: {init}{hint}; use --init random to train from scratch")
    if not os.access(init, os.R_OK | (os.X_OK if os.path.isdir(init) else 0)):
        raise CheckpointError(denied(init))
    if os.path.isdir(init):
        names = os.listdir(init)
        if ".metadata" in names:
            return init
        index = [n for n in names if n.endswith(".safetensors.index.json")]
        if len(index) == 1:
            return os.path.join(init, index[0])
        if any(n.endswith(".distcp") for n in names):
            raise CheckpointError(f"{init}: DCP shards but no .metadata: an incomplete (crashed) save")
        steps = sorted(n for n in names if STEP_RE.match(n))
        if steps:
            complete = [n for n in steps if os.path.isfile(os.path.join(init, n, ".metadata"))]
            raise CheckpointError(f"{init} is a training out_dir: pass one of its step directories, "
                                  + (f"e.g. its newest complete one, {os.path.join(init, complete[-1])}" if complete
                                     else f"once one is complete (none of {', '.join(steps)} has .metadata yet)"))
        raise CheckpointError(f"{init}: directory holds no checkpoint (no .metadata, no *.safetensors.index.json;"
                              f" {len(names)} entries)")
    if not init.endswith((".pt", ".pth", ".safetensors", ".safetensors.index.json")):
        raise CheckpointError(f"{init}: unsupported checkpoint format (.pt/.pth, .safetensors, an index json, a DCP"
                              " dir)")
    return init


def check_md5(path, want, url):
    """The content pin of a named init without a revision: the file's md5 (~10 s for 4 GB, on every load)."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    if digest.hexdigest() != want:
        raise CheckpointError(f"{url}: {path} has md5 {digest.hexdigest()}, upstream's downloader expects {want}: the"
                              " hub's file changed since. Check the new file's keys (`python ckpt.py check`) and pass"
                              " it as --init hf://ORG/REPO/FILE@REVISION")


def check_init_config(init, cfg):
    """A named init loads only into the config it was released for (INIT_CONFIGS). cfg: the model's DiTConfig."""
    need = INIT_CONFIGS.get(os.fspath(init))
    if need is None or not isinstance(cfg, DiTConfig):
        return
    expected = get_config(need)
    differ = [f.name for f in fields(expected) if getattr(cfg, f.name) != getattr(expected, f.name)]
    if differ:
        raise CheckpointError(f"--init {init} is a {need} checkpoint but the model's config differs in {differ}:"
                              f" build the model with --config {need}")


def _hf_download(url, offline):
    from huggingface_hub import constants, hf_hub_download
    spec, _, revision = url[len("hf://"):].partition("@")
    parts = spec.split("/")
    if len(parts) < 3 or not all(parts):
        raise CheckpointError(f"{url}: expected hf://ORG/REPO/PATH[@REVISION]")
    repo, filename = "/".join(parts[:2]), "/".join(parts[2:])
    offline = constants.HF_HUB_OFFLINE if offline is None else offline

    def fetch(name, what):
        try:
            return hf_hub_download(repo, name, revision=revision or None, local_files_only=offline)
        except Exception as e:  # re-raised with the url and what to do; the original stays chained
            mode = f"offline (HF_HUB_OFFLINE=1): {what} missing from the local cache" if offline else \
                "download failed"
            raise CheckpointError(f"{url}: {mode}: {type(e).__name__}: {e}. Gated Cosmos repos need an accepted"
                                  " license and HF_TOKEN; pre-download with `python ckpt.py check`.") from e
    path = fetch(filename, filename)
    if filename.endswith(".index.json"):  # sharded safetensors: fetch every shard next to the index
        for shard in dict.fromkeys(weight_map(path).values()):
            fetch(os.path.join(os.path.dirname(filename), shard), f"shard {shard} (listed in the index)")
    return path


# -----------------------------------------------------------------------------
# The tiny configs: CPU-fast, each on its own synthetic folder (clips/tiny.py builds it)

TINY_CONFIGS = ("tiny", "p25-tiny", "p25-tiny-agibot", "tiny-action", "tiny-action-wide", "tiny-action-wide-postnorm",
                "p25-tiny-action")  # CPU-fast: tiny VAE, 9x64x112, stand-in prompt


def tiny_data(config):
    """The tiny default's own folder (train.py builds it): 2x2 grids, a camera net's views, an action net's grids."""
    net = get_config(config)
    return "data/tiny_" + ("views" if net.camera_channels else "action_grid" if net.action_dim else "grid")
