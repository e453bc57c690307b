"""The text-embedding step: prompt embeddings for a stitched folder, from T5 (Predict2) or Cosmos-Reason1 (Predict2.5).

    pip install transformers sentencepiece      # optional dependencies, only for this script
    python t5.py ROOT [--device cuda] [--batch 8]         # Predict2: T5-XXL, ROOT/t5_xxl/<stem>.pickle
    python t5.py ROOT --encoder reason1 [--device cuda]   # Predict2.5: Reason1, ROOT/reason1/<sha1>.safetensors

Each unique prompt is encoded once (many episodes share a task), and so is the negative prompt of classifier-free
guidance (NEGATIVE_PROMPT: upstream's default, the same string in Predict2 and Predict2.5). Existing files are kept,
so a rerun only fills what is missing and loads no model when nothing is; files are written under a temporary name
and renamed. A model loads from a hub id (at --revision) or a local folder, and is refused when its config is of
another architecture or when weights are missing (from_pretrained would initialise those at random).

--encoder t5, upstream cosmos-predict2's recipe: the encoder of T5-11B in float32, max_length 512 with truncation, run
with the attention mask, the output trimmed to the prompt's real token count, stored for every VIDEO as
ROOT/t5_xxl/<stem>.pickle: a list of one float16 array (tokens, 1024), at most 1 MiB. The negative prompt:
ROOT/t5_xxl/negative_prompt.pickle (data.negative_prompt_path finds it).

--encoder reason1, upstream cosmos-predict2.5's recipe: the prompt as the user turn of Qwen2.5-VL's chat template
after a fixed system instruction (SYSTEM_INSTRUCTION), no generation prompt, padded with the tokenizer's own pad token
(or truncated) to 512 tokens, and run through the language model of Cosmos-Reason1-7B in bf16 WITHOUT an attention
mask, so the pad positions get real, non-zero hidden states; hidden_states[1..28] (the outputs of the 28 layers, the
last after the final RMSNorm) each normalised per token over its 3584 channels, (h - mean) / (std + 1e-8), and
concatenated: [512, 100352] bf16 (reason1_normalize_concat). Stored once per UNIQUE PROMPT as
ROOT/reason1/<sha1 of the prompt's UTF-8 bytes>.safetensors, one tensor `crossattn_emb`, metadata {prompt, encoder,
revision, format}; the negative prompt: ROOT/reason1/negative_prompt.safetensors. A rerun refuses files written by
another encoder or revision (they would mix two conditionings in one run).

Disk: a Reason1 embedding is 512 x 100352 x 2 bytes = 98 MiB (T5: at most 1 MiB), so the count of unique prompts
decides: ~50-60k for all of DROID, i.e. ~5 TiB. docs/text.md: the estimate, why neither fp8 nor compression, and the
cache after crossattn_proj (1 MiB a prompt) for runs that freeze that projection.

Contents, top to bottom: constants -> what to write (pending) -> writing (write_embeddings) -> T5 -> Reason1 -> loading
models -> command line.
"""
import dataclasses
import os
import pickle
import re
import time

import numpy as np
import safetensors
import safetensors.torch
import torch

from base import cli
from clips.data import list_videos
from clips.text import NEGATIVE_STEM, REASON1_FORMAT, reason1_path

ENCODERS = ("t5", "reason1")
FOLDERS = {"t5": "t5_xxl", "reason1": "reason1"}  # under ROOT

# Cosmos-Predict2's default negative prompt, verbatim: _DEFAULT_NEGATIVE_PROMPT in examples/video2world.py of
# github.com/nvidia-cosmos/cosmos-predict2 at commit 661da4774b0ca41d082a0ecbeb47550bcf07e03f (2025-10-06), the
# --negative_prompt default of its video2world inference. Predict2.5 uses the identical string: DEFAULT_NEGATIVE_PROMPT
# in cosmos_predict2/config.py L205 of nvidia-cosmos/cosmos-predict2.5 release 1.5.0, as contained in
# github.com/kechenliuuu3469/cosmos-predict2.5 at 7e5ffc83fefb2ae1c105c1185cdeb239efb1325c (compared character by
# character), so one string serves both encoders.
NEGATIVE_PROMPT = (
    "The video captures a series of frames showing ugly scenes, static with no motion, motion blur, "
    "over-saturation, shaky footage, low resolution, grainy texture, pixelated images, poorly lit areas, "
    "underexposed and overexposed scenes, poor color balance, washed out colors, choppy sequences, jerky "
    "movements, low frame rate, artifacting, color banding, unnatural transitions, outdated special "
    "effects, fake elements, unconvincing visuals, poorly edited content, jump cuts, visual noise, and "
    "flickering. Overall, the video is of poor quality.")

# The system turn of Predict2.5's text encoder, verbatim: cosmos_predict2/_src/predict2/text_encoders/text_encoder.py
# L149 (compute_text_embeddings_online) of kechenliuuu3469/cosmos-predict2.5 at
# 7e5ffc83fefb2ae1c105c1185cdeb239efb1325c; huggingface/diffusers' pipeline_cosmos2_5_predict.py
# (_get_prompt_embeds, read at 0313e3c1fa5afd5c3d9074e73f7cf4f76f45a964) sends the same string.
SYSTEM_INSTRUCTION = "You are a helpful assistant who will provide prompts to an image generator."
REASON1_TOKENS = 512  # NUM_EMBEDDING_PADDING_TOKENS upstream: every prompt is padded or truncated to this
# The text encoder upstream registers (uuid cb3e3ffa-7b08-4c34-822d-61c7aa31a14f, "nvidia/Cosmos-Reason1.1-7B", and
# its tokenizer 7219c6c7-...): packages/cosmos-oss/cosmos_oss/checkpoints.py of kechenliuuu3469/cosmos-predict2.5 at
# 7e5ffc83fefb2ae1c105c1185cdeb239efb1325c, hub repository nvidia/Cosmos-Reason1-7B pinned to this revision.
REASON1_MODEL = "nvidia/Cosmos-Reason1-7B"
REASON1_REVISION = "3210bec0495fdc7a8d3dbb8d58da5711eab4b423"
DEFAULT_MODELS = {"t5": ("google-t5/t5-11b", "main"), "reason1": (REASON1_MODEL, REASON1_REVISION)}
MODEL_TYPES = {"t5": "t5", "reason1": "qwen2_5_vl"}  # config.model_type each encoder's loader builds


# data.reason1_path(root, prompt): ROOT/reason1/<sha1(prompt.encode()).hexdigest()>.safetensors, where training reads
# them; data.REASON1_FORMAT = "reason1-full-concat-v1" (all layers normalised, concatenated) in their metadata.
def negative_path(root: str, encoder: str) -> str:
    return os.path.join(root, FOLDERS[encoder], NEGATIVE_STEM + (".pickle" if encoder == "t5" else ".safetensors"))


# ------------------------------------------------------------------------------------------- what to write

def check_reason1_file(path: str, prompt: str, source: dict | None):
    """An existing Reason1 file must hold `prompt` in this format, from `source` ({encoder, revision}; None: any)."""
    try:
        with safetensors.safe_open(path, "pt") as f:
            meta = f.metadata() or {}
    except safetensors.SafetensorError as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e}); delete it and rerun to re-encode") from None
    if meta.get("format") != REASON1_FORMAT or meta.get("prompt") != prompt:
        raise ValueError(f"{path}: metadata format {meta.get('format')!r} / prompt {meta.get('prompt', '')[:40]!r} is "
                         f"not {REASON1_FORMAT!r} / {prompt[:40]!r}; delete it and rerun to re-encode")
    if source is not None and (meta.get("encoder"), meta.get("revision")) != (source["encoder"], source["revision"]):
        raise ValueError(f"{path}: written by {meta.get('encoder')}@{meta.get('revision')}, this run encodes with "
                         f"{source['encoder']}@{source['revision']}; pass that --model/--revision, or delete "
                         f"{os.path.dirname(path)} to re-encode every prompt with the new encoder")


def pending(root: str, encoder: str = "t5", source: dict | None = None) -> dict:
    """{prompt: [paths to write]} for the videos of root without an embedding, plus the negative prompt's. t5: one
    path per video; reason1: one per unique prompt, and each existing file is checked (check_reason1_file)."""
    if encoder not in ENCODERS:
        raise ValueError(f"--encoder {encoder!r}: choose one of {', '.join(ENCODERS)}")
    targets = {}  # path -> prompt
    for v in list_videos(root):
        if not v.prompt:
            raise ValueError(f"{root}: video {v.stem} has no prompt (manifest.jsonl or metas/{v.stem}.txt)")
        path = os.path.join(root, "t5_xxl", v.stem + ".pickle") if encoder == "t5" else reason1_path(root, v.prompt)
        targets[path] = v.prompt
    targets[negative_path(root, encoder)] = NEGATIVE_PROMPT
    todo = {}
    for path, prompt in targets.items():
        if not os.path.exists(path):
            todo.setdefault(prompt, []).append(path)
        elif encoder == "reason1":
            check_reason1_file(path, prompt, source)
    return todo


# ------------------------------------------------------------------------------------------- writing

def check_finite(emb, prompt: str, stored: str):
    """Refuse to write an embedding holding NaN/Inf (T5 activations can pass float16's 65504): clips/data.py would refuse the
    file at start-up anyway, and this names the prompt."""
    finite = torch.isfinite(emb).all() if isinstance(emb, torch.Tensor) else np.isfinite(emb).all()
    if not finite:
        raise ValueError(f"the encoder's embedding of {prompt[:60]!r} holds NaN/Inf as {stored}: nothing written for "
                         "it; check the encoder's dtype (run it in float32 or bfloat16)")


def save_t5(path: str, emb, prompt: str, source: dict | None):
    with np.errstate(over="ignore"):  # an overflow is refused below, naming the prompt
        emb = np.asarray(emb, dtype=np.float16)
    if emb.ndim != 2 or not 1 <= len(emb) <= 512:
        raise ValueError(f"encoder returned shape {emb.shape} for {prompt[:60]!r}; expected (1..512, dim)")
    check_finite(emb, prompt, "float16")
    with open(path + ".tmp", "wb") as f:
        pickle.dump([emb], f)
    os.replace(path + ".tmp", path)


def save_reason1(path: str, emb, prompt: str, source: dict):
    if not isinstance(emb, torch.Tensor) or emb.ndim != 2 or emb.dtype != torch.bfloat16:
        raise ValueError(f"encoder returned {getattr(emb, 'dtype', type(emb))} {tuple(getattr(emb, 'shape', ()))} "
                         f"for {prompt[:60]!r}; expected a bf16 tensor (tokens, dim)")
    check_finite(emb, prompt, "bfloat16")
    metadata = {"prompt": prompt, "encoder": source["encoder"], "revision": source["revision"],
                "format": REASON1_FORMAT}
    safetensors.torch.save_file({"crossattn_emb": emb.contiguous()}, path + ".tmp", metadata=metadata)
    os.replace(path + ".tmp", path)


def write_embeddings(root: str, encode, batch: int = 8, encoder: str = "t5", source: dict | None = None) -> dict:
    """encode(list of prompts) -> one embedding per prompt: t5, float arrays (tokens, dim); reason1, bf16 tensors
    (tokens, dim), saved with `source` ({encoder, revision}) as metadata. Returns counts of videos, prompts encoded
    (the negative prompt included) and files written."""
    if encoder == "reason1" and source is None:
        raise ValueError("write_embeddings(encoder='reason1') needs source={'encoder': ..., 'revision': ...}: the "
                         "files record which model wrote them")
    save = save_t5 if encoder == "t5" else save_reason1
    todo = pending(root, encoder, source)
    os.makedirs(os.path.join(root, FOLDERS[encoder]), exist_ok=True)
    prompts = sorted(todo)
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        for prompt, emb in zip(chunk, encode(chunk), strict=True):
            for path in todo[prompt]:
                save(path, emb, prompt, source)
        done = min(i + batch, len(prompts))
        print(f"{encoder}: {done}/{len(prompts)} unique prompts encoded "
              f"({(time.perf_counter() - start) / done:.2f} s a prompt, writing included)", flush=True)
    return {"videos": len(list_videos(root)), "unique_prompts": len(prompts),
            "files": sum(len(paths) for paths in todo.values())}


def report_truncated(encoder: str, prompt: str, tokens: int, limit: int):
    """Upstream truncates long prompts without a word; we keep its behaviour and say so."""
    if tokens > limit:
        print(f"{encoder}: {prompt[:60]!r}... has {tokens} tokens, truncated to {limit} as upstream does", flush=True)


# ------------------------------------------------------------------------------------------- T5

def encoder_fn(tokenizer, encoder, device: str):
    """encode(prompts) for write_embeddings from a built tokenizer and T5 encoder, the upstream way: padded to 512
    tokens (truncated beyond), run with the attention mask, outputs past each prompt's real length (EOS included)
    cut off."""

    @torch.no_grad()
    def encode(prompts: list) -> list:
        for p in prompts:
            report_truncated("t5", p, len(tokenizer(p).input_ids), 512)
        tokens = tokenizer(prompts, return_tensors="pt", padding="max_length", max_length=512, truncation=True)
        hidden = encoder(input_ids=tokens.input_ids.to(device), attention_mask=tokens.attention_mask.to(device))
        lengths = tokens.attention_mask.sum(1).tolist()
        return [hidden.last_hidden_state[i, :n].float().cpu().numpy() for i, n in enumerate(lengths)]

    return encode


# ------------------------------------------------------------------------------------------- Reason1

def reason1_normalize_concat(hidden_states) -> torch.Tensor:
    """[B, N, L*W] from an LM's L+1 hidden states (a sequence of [B, N, W], or one [L+1, B, N, W] tensor; entry 0, the
    token embeddings, is dropped): each layer normalised per token over its W channels, (h - mean) / (std + 1e-8)
    with the unbiased std, in the hidden states' own dtype (bf16 for the real encoder, as upstream), then the L
    layers concatenated in order (upstream's FULL_CONCAT)."""
    if len(hidden_states) < 2:
        raise ValueError(f"reason1_normalize_concat: {len(hidden_states)} hidden states; need the embeddings (entry "
                         "0) and at least one layer output (run the LM with output_hidden_states=True)")
    return torch.cat([(h - h.mean(-1, keepdim=True)) / (h.std(-1, keepdim=True) + 1e-8) for h in hidden_states[1:]],
                     dim=-1)


def reason1_token_ids(tokenizer, prompt: str, length: int = REASON1_TOKENS) -> list:
    """The `length` token ids upstream feeds Reason1 for `prompt`: the system instruction and the prompt as a
    two-turn chat without generation prompt, tokenized as its processor does (the rendered text, then the
    tokenizer), cut to `length` or padded with the tokenizer's pad token."""
    messages = [{"role": "system", "content": [{"type": "text", "text": SYSTEM_INSTRUCTION}]},
                {"role": "user", "content": [{"type": "text", "text": prompt}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, add_vision_id=False)
    ids = list(tokenizer(text).input_ids)
    report_truncated("reason1", prompt, len(ids), length)
    return ids[:length] + [tokenizer.pad_token_id] * (length - len(ids))


def reason1_encoder_fn(tokenizer, lm, device: str, length: int = REASON1_TOKENS):
    """encode(prompts) for write_embeddings from a built tokenizer (with a chat template and a pad token) and the
    language model of a Qwen2.5-VL (anything that takes input_ids and returns .hidden_states): [length, L*W] bf16
    tensors on the CPU, one per prompt."""
    if tokenizer.pad_token_id is None or not tokenizer.chat_template:
        raise ValueError(f"the Reason1 tokenizer needs a pad token and a chat template; it has pad token "
                         f"{tokenizer.pad_token!r} and {'a' if tokenizer.chat_template else 'no'} chat template: "
                         "is --model a Qwen2.5-VL checkpoint?")

    @torch.no_grad()
    def encode(prompts: list) -> list:
        ids = torch.tensor([reason1_token_ids(tokenizer, p, length) for p in prompts], device=device)
        out = lm(input_ids=ids, output_hidden_states=True, use_cache=False)  # no attention mask: pads are tokens
        emb = reason1_normalize_concat(out.hidden_states).cpu()
        return [e.clone() for e in emb]  # own storage: each is saved alone

    return encode


# ------------------------------------------------------------------------------------------- loading models

def model_source(encoder: str, model: str, revision: str) -> tuple:
    """(model, revision) from the flags: empty --model = the encoder's default; empty --revision = the pinned one for
    the default reason1 model, main for another hub id; a local folder has none (given one: an error)."""
    default_model, default_revision = DEFAULT_MODELS[encoder]
    model = model or default_model
    if os.path.isdir(model):
        if revision:
            raise ValueError(f"--revision {revision}: --model {model} is a local folder, which has no revisions; "
                             "drop --revision")
        if not os.path.exists(os.path.join(model, "config.json")):
            raise ValueError(f"--model {model}: a folder without config.json; give a downloaded checkpoint "
                             f"(huggingface-cli download {default_model} --local-dir DIR) or a hub id")
        return model, ""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        raise ValueError(f"--model {model}: no such folder, and not a hub id (owner/name)")
    return model, revision or (default_revision if model == default_model else "main")


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise SystemExit(f"t5.py needs the optional dependency transformers (pip install transformers "
                         f"sentencepiece): {e}") from None
    return transformers


def load_pretrained(cls, encoder: str, model: str, revision: str, dtype: torch.dtype) -> tuple:
    """(tokenizer, cls.from_pretrained) of `model`, refused for a config of another architecture (checked first) or
    missing / reshaped weights (which from_pretrained would initialise at random); unused weights are counted."""
    transformers = _transformers()
    revision = revision or None  # a local folder
    config = transformers.AutoConfig.from_pretrained(model, revision=revision)
    if config.model_type != MODEL_TYPES[encoder]:
        raise ValueError(f"--model {model}: a {config.model_type!r} checkpoint; --encoder {encoder} needs a "
                         f"{MODEL_TYPES[encoder]!r} one (default: {DEFAULT_MODELS[encoder][0]})")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model, revision=revision)
    net, info = cls.from_pretrained(model, revision=revision, torch_dtype=dtype, output_loading_info=True)
    missing, reshaped = list(info["missing_keys"]), list(info["mismatched_keys"])
    if missing or reshaped:
        raise ValueError(f"--model {model}: {len(missing)} weights missing (e.g. {missing[:3]}) and {len(reshaped)} of "
                         f"another shape (e.g. {reshaped[:3]}) for {cls.__name__}; is it the right checkpoint?")
    if info["unexpected_keys"]:
        print(f"{encoder}: {len(info['unexpected_keys'])} weights of {model} unused by {cls.__name__} (e.g. "
              f"{sorted(info['unexpected_keys'])[0]})", flush=True)
    return tokenizer, net


def t5_encoder(model: str, device: str, revision: str = ""):
    """The upstream Predict2 text encoder: T5EncoderModel + its tokenizer from `model` (hub id or folder) in fp32."""
    tokenizer, encoder = load_pretrained(_transformers().T5EncoderModel, "t5", model, revision, torch.float32)
    return encoder_fn(tokenizer, encoder.to(device).eval(), device)


def reason1_encoder(model: str, device: str, revision: str = ""):
    """The upstream Predict2.5 text encoder: Cosmos-Reason1-7B (a Qwen2.5-VL) in bf16 with its tokenizer; only its
    language model runs (the vision tower comes along: ~1.3 GB), never the LM head."""
    tokenizer, net = load_pretrained(_transformers().Qwen2_5_VLForConditionalGeneration, "reason1", model, revision,
                                     torch.bfloat16)
    return reason1_encoder_fn(tokenizer, net.model.to(device).eval(), device)


# ------------------------------------------------------------------------------------------- command line

@dataclasses.dataclass
class T5Config:
    root: str  # ROOT: a stitched folder (stitch.py OUT)
    encoder: str = "t5"  # t5 (Predict2: T5-XXL, a pickle per video) or reason1 (Predict2.5: Cosmos-Reason1-7B,
    # a 98 MiB safetensors file per unique prompt)
    model: str = ""  # hub id or local folder of the encoder; empty: google-t5/t5-11b (t5), nvidia/Cosmos-Reason1-7B
    # (reason1)
    revision: str = ""  # hub revision of --model; empty: 3210bec0495fdc7a8d3dbb8d58da5711eab4b423 (upstream's pin) for
    # the default reason1 model, main for any other hub id; none for a local folder
    device: str = "cuda"  # where the encoder runs (t5: fp32, ~19 GB for T5-11B's encoder; reason1: bf16, ~17 GB)
    batch: int = 8  # prompts per forward pass


def main(argv=None) -> int:
    cfg = cli.parse(T5Config, argv, description=__doc__, positional=("root",), prog="t5.py")
    if cfg.encoder not in ENCODERS:
        raise ValueError(f"--encoder {cfg.encoder!r}: choose one of {', '.join(ENCODERS)}")
    if cfg.batch < 1:
        raise ValueError(f"--batch {cfg.batch} must be >= 1")
    model, revision = model_source(cfg.encoder, cfg.model, cfg.revision)
    source = {"encoder": model, "revision": revision}
    todo = pending(cfg.root, cfg.encoder, source)  # checks the folder, its prompts and files before the model loads
    encode = None
    if todo:
        encode = (t5_encoder if cfg.encoder == "t5" else reason1_encoder)(model, cfg.device, revision)
    print(f"{cfg.encoder}: {write_embeddings(cfg.root, encode, cfg.batch, cfg.encoder, source)}")
    return 0


if __name__ == "__main__":
    cli.main(main, user_errors=(ValueError, OSError))
