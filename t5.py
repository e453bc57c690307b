"""T5-XXL text embeddings for a stitched folder, in the upstream layout: ROOT/t5_xxl/<stem>.pickle.

    pip install transformers sentencepiece      # optional dependencies, only for this script
    python t5.py ROOT [--model google-t5/t5-11b] [--device cuda] [--batch 8]

Each unique prompt is encoded once (many episodes share a task) and its embedding written for every video that uses
it, as upstream cosmos-predict2 does: the encoder of T5-11B in float32, max_length 512 with truncation, and the
output trimmed to the prompt's real token count, stored as a list of one float16 array (tokens, 1024). The negative
prompt of classifier-free guidance (NEGATIVE_PROMPT, upstream's default) is encoded the same way, once, into
ROOT/t5_xxl/negative_prompt.pickle (data.negative_prompt_path finds it). Existing pickles are kept, so a rerun only
fills what is missing and loads no model when nothing is; files are written under a temporary name and renamed.
"""
import dataclasses
import os
import pickle

import numpy as np

import cli
from data import NEGATIVE_STEM, list_videos

# Cosmos-Predict2's default negative prompt, verbatim: _DEFAULT_NEGATIVE_PROMPT in examples/video2world.py of
# github.com/nvidia-cosmos/cosmos-predict2 at commit 661da4774b0ca41d082a0ecbeb47550bcf07e03f (2025-10-06), the
# --negative_prompt default of its video2world inference.
NEGATIVE_PROMPT = (
    "The video captures a series of frames showing ugly scenes, static with no motion, motion blur, "
    "over-saturation, shaky footage, low resolution, grainy texture, pixelated images, poorly lit areas, "
    "underexposed and overexposed scenes, poor color balance, washed out colors, choppy sequences, jerky "
    "movements, low frame rate, artifacting, color banding, unnatural transitions, outdated special "
    "effects, fake elements, unconvincing visuals, poorly edited content, jump cuts, visual noise, and "
    "flickering. Overall, the video is of poor quality.")


def pending(root: str) -> dict:
    """{prompt: [pickle paths to write]} for the videos of root without an embedding, plus the negative prompt's."""
    videos = list_videos(root)
    todo = {}
    for v in videos:
        if not v.prompt:
            raise ValueError(f"{root}: video {v.stem} has no prompt (manifest.jsonl or metas/{v.stem}.txt)")
        path = os.path.join(root, "t5_xxl", v.stem + ".pickle")
        if not os.path.exists(path):
            todo.setdefault(v.prompt, []).append(path)
    negative = os.path.join(root, "t5_xxl", NEGATIVE_STEM + ".pickle")
    if not os.path.exists(negative):
        todo.setdefault(NEGATIVE_PROMPT, []).append(negative)
    return todo


def write_embeddings(root: str, encode, batch: int = 8) -> dict:
    """encode(list of prompts) -> list of float arrays (tokens, dim). Returns counts of videos, prompts encoded
    (the negative prompt included) and files written."""
    todo = pending(root)
    os.makedirs(os.path.join(root, "t5_xxl"), exist_ok=True)
    prompts = sorted(todo)
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        for prompt, emb in zip(chunk, encode(chunk), strict=True):
            emb = np.asarray(emb, dtype=np.float16)
            if emb.ndim != 2 or not 1 <= len(emb) <= 512:
                raise ValueError(f"encoder returned shape {emb.shape} for {prompt[:60]!r}; expected (1..512, dim)")
            for path in todo[prompt]:
                with open(path + ".tmp", "wb") as f:
                    pickle.dump([emb], f)
                os.replace(path + ".tmp", path)
        print(f"t5: {min(i + batch, len(prompts))}/{len(prompts)} unique prompts encoded", flush=True)
    return {"videos": len(list_videos(root)), "unique_prompts": len(prompts),
            "files": sum(len(paths) for paths in todo.values())}


def encoder_fn(tokenizer, encoder, device: str):
    """encode(prompts) for write_embeddings from a built tokenizer and T5 encoder, the upstream way: padded to 512
    tokens (truncated beyond), run with the attention mask, outputs past each prompt's real length (EOS included)
    cut off."""
    import torch

    @torch.no_grad()
    def encode(prompts: list) -> list:
        tokens = tokenizer(prompts, return_tensors="pt", padding="max_length", max_length=512, truncation=True)
        hidden = encoder(input_ids=tokens.input_ids.to(device), attention_mask=tokens.attention_mask.to(device))
        lengths = tokens.attention_mask.sum(1).tolist()
        return [hidden.last_hidden_state[i, :n].float().cpu().numpy() for i, n in enumerate(lengths)]

    return encode


def t5_encoder(model: str, device: str):
    """The upstream text encoder: T5EncoderModel + T5TokenizerFast from `model` (hub id or folder) in fp32."""
    try:
        import torch
        from transformers import T5EncoderModel, T5TokenizerFast
    except ImportError as e:
        raise SystemExit(f"t5.py needs the optional dependency transformers (pip install transformers "
                         f"sentencepiece): {e}") from None
    tokenizer = T5TokenizerFast.from_pretrained(model)
    encoder = T5EncoderModel.from_pretrained(model, torch_dtype=torch.float32).to(device).eval()
    return encoder_fn(tokenizer, encoder, device)


@dataclasses.dataclass
class T5Config:
    root: str  # ROOT: a stitched folder (stitch.py OUT)
    model: str = "google-t5/t5-11b"  # hub id or local folder of the T5 weights
    device: str = "cuda"  # where the encoder runs (fp32: ~19 GB for T5-11B's encoder)
    batch: int = 8  # prompts per forward pass


def main(argv=None) -> int:
    cfg = cli.parse(T5Config, argv, description=__doc__, positional=("root",), prog="t5.py")
    if cfg.batch < 1:
        raise ValueError(f"--batch {cfg.batch} must be >= 1")
    todo = pending(cfg.root)  # checks the folder and its prompts before the model loads
    encode = t5_encoder(cfg.model, cfg.device) if todo else None
    print(f"t5: {write_embeddings(cfg.root, encode, cfg.batch)}")
    return 0


if __name__ == "__main__":
    cli.main(main, user_errors=(ValueError, OSError))
