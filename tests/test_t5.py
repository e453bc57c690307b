"""t5.py: the encode function on a tiny randomly initialised T5 encoder with a tokenizer built here (no downloads),
the embeddings it writes read back by data.GridClips, and the command line."""
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

import data
import t5
from test_stitch import SIZE, V30, stitched

WORDS = "a robot puts the marker in cup open drawer place red block bowl close laptop lid".split()


def tiny_t5():
    """(tokenizer, encoder): one token per known word plus </s>, like T5's; a 2-layer encoder of width 16."""
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(0)
    config = T5Config(vocab_size=len(vocab), d_model=16, d_kv=4, num_heads=2, num_layers=2, d_ff=32, dropout_rate=0.0)
    return tokenizer, T5EncoderModel(config).eval()


def test_encode_trims_to_the_real_tokens_and_padding_does_not_leak():
    tokenizer, encoder = tiny_t5()
    encode = t5.encoder_fn(tokenizer, encoder, "cpu")
    prompts = ["a robot puts the marker", "open drawer", " ".join(["cup"] * 600)]
    out = encode(prompts)
    assert [e.shape for e in out] == [(6, 16), (3, 16), (512, 16)]  # words + </s>; truncated to 512 with </s>
    assert all(e.dtype == np.float32 for e in out)
    with torch.no_grad():  # each prompt alone, unpadded: what the padded batch must reproduce
        alone = [encoder(input_ids=tokenizer(p, return_tensors="pt").input_ids).last_hidden_state[0].numpy()
                 for p in prompts[:2]]
    for got, want in zip(out, alone):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_embeddings_of_the_tiny_encoder_feed_gridclips(tmp_path):
    root = shutil.copytree(stitched(V30)[0], tmp_path / "grid")
    tokenizer, encoder = tiny_t5()
    counts = t5.write_embeddings(str(root), t5.encoder_fn(tokenizer, encoder, "cpu"), batch=2)
    assert counts == {"videos": 3, "unique_prompts": 3, "files": 4}
    with open(data.negative_prompt_path(str(root)), "rb") as f:
        (neg,) = pickle.load(f)
    assert neg.dtype == np.float16 and neg.shape[1] == 16
    ds = data.GridClips(str(root), frames=9, height=SIZE[0], width=SIZE[1], text_len=512, text_dim=16)
    sample = ds[0]
    assert sample["text_emb"].shape == (512, 16) and 1 < int(sample["text_mask"].sum()) < 512


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, t5.__file__, *map(str, args)], capture_output=True, text=True)


def test_command_line(tmp_path, capsys):
    proc = run_cli(tmp_path / "nothing", "--device", "cpu", "--batch", "8")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("t5.py: error: ") and "neither manifest.jsonl nor videos/ exists" in proc.stderr
    assert run_cli().returncode == 2  # ROOT is required
    help_text = " ".join(run_cli("--help").stdout.split())  # argparse wraps lines
    assert "(default: 'google-t5/t5-11b')" in help_text and "--batch INT" in help_text
    root = shutil.copytree(stitched(V30)[0], tmp_path / "grid")
    with pytest.raises(ValueError, match="--batch 0"):
        t5.main([str(root), "--batch", "0"])
    t5.write_embeddings(str(root), lambda prompts: [np.ones((3, 1024))] * len(prompts))
    # nothing left to encode: the documented command line runs without loading a model (this one does not exist)
    assert t5.main([str(root), "--device", "cuda", "--model", str(tmp_path / "no-model"), "--batch", "8"]) == 0
    assert "'files': 0" in capsys.readouterr().out
    os.remove(os.path.join(root, "t5_xxl", "negative_prompt.pickle"))
    with pytest.raises(OSError, match="no-model"):  # now there is work: the model loads, and this one doesn't exist
        t5.main([str(root), "--device", "cpu", "--model", str(tmp_path / "no-model")])
