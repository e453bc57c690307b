"""T5-XXL text embeddings for a stitched folder, in the upstream layout: ROOT/t5_xxl/<stem>.pickle.

    pip install transformers sentencepiece      # optional dependencies, only for this script
    python t5.py ROOT [--model google-t5/t5-11b] [--device cuda] [--batch 8]

Each unique prompt is encoded once (many episodes share a task) and its embedding written for every video that uses
it, as upstream cosmos-predict2 does: the encoder of T5-11B in float32, max_length 512 with truncation, and the
output trimmed to the prompt's real token count, stored as a list of one float16 array (tokens, 1024). Existing
pickles are kept, so a rerun only fills what is missing; files are written under a temporary name and renamed.
"""
import argparse
import os
import pickle

import numpy as np

from data import list_videos


def write_embeddings(root: str, encode, batch: int = 8) -> dict:
    """encode(list of prompts) -> list of float arrays (tokens, dim). Returns counts of prompts and files."""
    videos = list_videos(root)
    os.makedirs(os.path.join(root, "t5_xxl"), exist_ok=True)
    todo = {}
    for v in videos:
        if not v.prompt:
            raise ValueError(f"{root}: video {v.stem} has no prompt (manifest.jsonl or metas/{v.stem}.txt)")
        if not os.path.exists(os.path.join(root, "t5_xxl", v.stem + ".pickle")):
            todo.setdefault(v.prompt, []).append(v.stem)
    prompts = sorted(todo)
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        for prompt, emb in zip(chunk, encode(chunk)):
            emb = np.asarray(emb, dtype=np.float16)
            if emb.ndim != 2 or not 1 <= len(emb) <= 512:
                raise ValueError(f"encoder returned shape {emb.shape} for {prompt[:60]!r}; expected (1..512, dim)")
            for stem in todo[prompt]:
                path = os.path.join(root, "t5_xxl", stem + ".pickle")
                with open(path + ".tmp", "wb") as f:
                    pickle.dump([emb], f)
                os.replace(path + ".tmp", path)
        print(f"t5: {min(i + batch, len(prompts))}/{len(prompts)} unique prompts encoded")
    return {"videos": len(videos), "unique_prompts": len(prompts), "files": sum(len(s) for s in todo.values())}


def t5_encoder(model: str, device: str):
    """The upstream text encoder: T5EncoderModel + T5TokenizerFast, fp32, padded to 512, outputs past the end cut."""
    try:
        import torch
        from transformers import T5EncoderModel, T5TokenizerFast
    except ImportError as e:
        raise SystemExit(f"t5.py needs the optional dependency transformers (pip install transformers "
                         f"sentencepiece): {e}") from None
    tokenizer = T5TokenizerFast.from_pretrained(model)
    encoder = T5EncoderModel.from_pretrained(model, torch_dtype=torch.float32).to(device).eval()

    @torch.no_grad()
    def encode(prompts: list) -> list:
        tokens = tokenizer(prompts, return_tensors="pt", padding="max_length", max_length=512, truncation=True,
                           return_length=True)
        hidden = encoder(input_ids=tokens.input_ids.to(device), attention_mask=tokens.attention_mask.to(device))
        lengths = tokens.attention_mask.sum(1).tolist()
        return [hidden.last_hidden_state[i, :n].float().cpu().numpy() for i, n in enumerate(lengths)]

    return encode


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="a stitched folder (stitch.py OUT)")
    p.add_argument("--model", default="google-t5/t5-11b", help="hub id or local folder of the T5 weights")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    print(f"t5: {write_embeddings(args.root, t5_encoder(args.model, args.device), args.batch)}")
