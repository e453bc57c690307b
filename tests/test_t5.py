"""t5.py, both encoders really run: tiny randomly initialised models (a T5 encoder-decoder, a Qwen2.5-VL) and
tokenizers built here, saved to folders and loaded by t5.py's own loaders (no downloads); the files they write read
back (T5's by data.GridClips); Reason1's normalise+concat against the upstream reference; resuming; the command line."""
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    T5Config,
    T5EncoderModel,
    T5ForConditionalGeneration,
)

import t5
from base import cli
from clips import data, text
from test_stitch import SIZE, V30, stitched

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
WORDS = "a robot puts the marker in cup open drawer place red block bowl close laptop lid".split()


def tiny_t5(decoder: bool = False):
    """(tokenizer, model): one token per known word plus </s>, like T5's; 2 layers of width 16. decoder=True: the
    whole encoder-decoder, as the released T5-11B checkpoint holds it."""
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(0)
    config = T5Config(vocab_size=len(vocab), d_model=16, d_kv=4, num_heads=2, num_layers=2, d_ff=32, dropout_rate=0.0)
    return tokenizer, (T5ForConditionalGeneration if decoder else T5EncoderModel)(config).eval()


# A chat template that renders text turns the way Qwen2.5-VL's does: <|im_start|>role\ntext<|im_end|>\n per turn.
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}{{ c['text'] }}"
                 "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]  # <|endoftext|>: Qwen's pad token
QWEN_WORDS = sorted(set(t5.SYSTEM_INSTRUCTION.lower().replace(".", " . ").split() + WORDS + ["system", "user", "put"]
                        + t5.NEGATIVE_PROMPT.lower().replace(".", " . ").replace(",", " , ").split()))
LAYERS, WIDTH = 3, 32


def tiny_qwen():
    """(tokenizer, model): a lower-cased word-level tokenizer with Qwen's special tokens, pad token and a chat
    template; a randomly initialised Qwen2.5-VL (3 LM layers of width 32, one vision block)."""
    vocab = {t: i for i, t in enumerate(QWEN_SPECIAL + QWEN_WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", unk_token="<unk>",
                                        additional_special_tokens=QWEN_SPECIAL[1:3], chat_template=CHAT_TEMPLATE)
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=WIDTH, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=WIDTH,
                           fullatt_block_indexes=[0]))
    torch.manual_seed(0)
    return tokenizer, Qwen2_5_VLForConditionalGeneration(config).eval()


def saved(tmp_path, name, tokenizer, model) -> str:
    folder = str(tmp_path / name)
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def manifest_folder(tmp_path, prompts: list) -> str:
    """A folder of videos as list_videos sees it (manifest.jsonl); the text step needs no pixels."""
    root = tmp_path / "grid"
    root.mkdir()
    with open(root / "manifest.jsonl", "w") as f:
        for i, prompt in enumerate(prompts):
            f.write(json.dumps({"stem": f"ep{i}", "prompt": prompt, "n_out": 93, "height": 16, "width": 16}) + "\n")
    return str(root)


def read_reason1(path: str) -> tuple:
    with safetensors.safe_open(path, "pt") as f:
        return f.get_tensor("crossattn_emb"), f.metadata()


# ------------------------------------------------------------------------------------------- T5

def test_encode_trims_to_the_real_tokens_and_padding_does_not_leak(capsys):
    tokenizer, encoder = tiny_t5()
    encode = t5.encoder_fn(tokenizer, encoder, "cpu")
    prompts = ["a robot puts the marker", "open drawer", " ".join(["cup"] * 600)]
    out = encode(prompts)
    assert [e.shape for e in out] == [(6, 16), (3, 16), (512, 16)]  # words + </s>; truncated to 512 with </s>
    assert all(e.dtype == np.float32 for e in out)
    assert "has 601 tokens, truncated to 512" in capsys.readouterr().out  # said, not silent
    with torch.no_grad():  # each prompt alone, unpadded: what the padded batch must reproduce
        alone = [encoder(input_ids=tokenizer(p, return_tensors="pt").input_ids).last_hidden_state[0].numpy()
                 for p in prompts[:2]]
    for got, want in zip(out, alone):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_t5_end_to_end_from_a_saved_checkpoint_feeds_gridclips(tmp_path, capsys):
    """The user's first step, as run: t5.py loads a T5 encoder-decoder checkpoint (as T5-11B's) and its tokenizer
    from a folder, encodes a stitched folder, and GridClips reads the result."""
    root = shutil.copytree(stitched(V30)[0], tmp_path / "grid")
    tokenizer, full = tiny_t5(decoder=True)
    folder = saved(tmp_path, "t5-tiny", tokenizer, full)
    assert t5.main([str(root), "--model", folder, "--device", "cpu", "--batch", "2"]) == 0
    assert "{'videos': 3, 'unique_prompts': 3, 'files': 4}" in capsys.readouterr().out
    videos = data.list_videos(str(root))
    with open(os.path.join(root, "t5_xxl", videos[0].stem + ".pickle"), "rb") as f:
        (emb,) = pickle.load(f)
    with torch.no_grad():  # the loaded encoder is the checkpoint's encoder
        want = full.encoder(input_ids=tokenizer(videos[0].prompt, return_tensors="pt").input_ids).last_hidden_state[0]
    assert emb.dtype == np.float16 and emb.shape == want.shape and 1 < len(emb) < 512  # the prompt's own tokens
    np.testing.assert_allclose(emb.astype(np.float32), want.numpy(), rtol=2e-3, atol=2e-3)  # float16 storage
    with open(text.negative_prompt_path(str(root)), "rb") as f:
        (neg,) = pickle.load(f)
    assert neg.dtype == np.float16 and neg.shape[1] == 16
    ds = data.GridClips(str(root), frames=9, height=SIZE[0], width=SIZE[1], text_len=512, text_dim=16)
    sample = ds[0]
    assert sample["text_emb"].shape == (512, 16) and 1 < int(sample["text_mask"].sum()) < 512


def test_loaders_refuse_another_architecture_and_missing_weights(tmp_path):
    tokenizer, qwen = tiny_qwen()
    folder = saved(tmp_path, "qwen-tiny", tokenizer, qwen)
    with pytest.raises(ValueError, match="'qwen2_5_vl' checkpoint; --encoder t5 needs a 't5' one"):
        t5.t5_encoder(folder, "cpu")
    tokenizer, encoder = tiny_t5()
    folder = saved(tmp_path, "t5-tiny", tokenizer, encoder)
    weights = os.path.join(folder, "model.safetensors")
    state = safetensors.torch.load_file(weights)
    del state["encoder.block.1.layer.0.SelfAttention.q.weight"]  # from_pretrained alone would draw it at random
    safetensors.torch.save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"1 weights missing \(e.g. \['encoder.block.1.layer.0.SelfAttention.q"):
        t5.t5_encoder(folder, "cpu")
    with pytest.raises(ValueError, match="'t5' checkpoint; --encoder reason1 needs a 'qwen2_5_vl' one"):
        t5.reason1_encoder(folder, "cpu")


# ------------------------------------------------------------------------------------------- Reason1

def test_reason1_normalize_concat_matches_upstream():
    """tests/data/p25_text_ref.safetensors: fake hidden states [L+1, B, N, W] and upstream's embedding of them."""
    ref = safetensors.torch.load_file(os.path.join(DATA, "p25_text_ref.safetensors"))
    hidden, want = ref["in.text_hidden_states_Lp1_B_N_W"], ref["in.crossattn_emb"]
    got = t5.reason1_normalize_concat(hidden)
    assert got.shape == want.shape == (2, 12, 3 * 40)
    assert (got - want).abs().max().item() <= 1e-6
    assert torch.equal(t5.reason1_normalize_concat(tuple(hidden)), got)  # a tuple, as transformers returns them
    assert torch.equal(t5.reason1_normalize_concat(hidden[1:]), got[..., 40:])  # the first entry is dropped
    with pytest.raises(ValueError, match="need the embeddings"):
        t5.reason1_normalize_concat(hidden[:1])


def test_reason1_token_ids_are_the_chat_padded_with_the_pad_token(capsys):
    tokenizer, _ = tiny_qwen()
    ids = t5.reason1_token_ids(tokenizer, "Put the marker in the cup.", length=40)
    words = ["<|im_start|>", "system", *t5.SYSTEM_INSTRUCTION.lower().replace(".", " .").split(), "<|im_end|>",
             "<|im_start|>", "user", "put", "the", "marker", "in", "the", "cup", ".", "<|im_end|>"]
    assert tokenizer.convert_ids_to_tokens(ids[:len(words)]) == words
    assert ids[len(words):] == [tokenizer.pad_token_id] * (40 - len(words)) and tokenizer.pad_token_id == 0
    long = t5.reason1_token_ids(tokenizer, " ".join(["cup"] * 50), length=40)
    assert len(long) == 40 and tokenizer.pad_token_id not in long  # truncated, like upstream...
    assert "truncated to 40 as upstream does" in capsys.readouterr().out  # ...but not silently


def test_reason1_end_to_end_from_a_saved_checkpoint(tmp_path, capsys):
    """t5.py --encoder reason1 loads a (tiny) Qwen2.5-VL checkpoint and tokenizer from a folder and writes one bf16
    [512, layers x width] file per unique prompt, named by the prompt's sha1, plus the negative prompt's."""
    prompts = ["Place the red block in the bowl.", "Close the laptop lid", "Place the red block in the bowl."]
    root = manifest_folder(tmp_path, prompts)
    tokenizer, qwen = tiny_qwen()
    folder = saved(tmp_path, "qwen-tiny", tokenizer, qwen)
    assert t5.main([root, "--encoder", "reason1", "--model", folder, "--device", "cpu", "--batch", "2"]) == 0
    assert "{'videos': 3, 'unique_prompts': 3, 'files': 3}" in capsys.readouterr().out
    names = {hashlib.sha1(p.encode()).hexdigest() + ".safetensors" for p in prompts} | {"negative_prompt.safetensors"}
    assert set(os.listdir(os.path.join(root, "reason1"))) == names  # no temporary file left
    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, torch_dtype=torch.bfloat16).eval()
    for prompt in ("Close the laptop lid", t5.NEGATIVE_PROMPT):
        path = t5.reason1_path(root, prompt) if prompt != t5.NEGATIVE_PROMPT else t5.negative_path(root, "reason1")
        emb, meta = read_reason1(path)
        assert emb.dtype == torch.bfloat16 and emb.shape == (512, LAYERS * WIDTH)
        assert meta == {"prompt": prompt, "encoder": folder, "revision": "", "format": "reason1-full-concat-v1"}
        ids = torch.tensor([t5.reason1_token_ids(tokenizer, prompt)])
        with torch.no_grad():  # this prompt alone, through the whole model as diffusers runs it, normalised here
            hidden = loaded(input_ids=ids, output_hidden_states=True).hidden_states
        assert len(hidden) == LAYERS + 1
        want = torch.cat([(h - h.mean(-1, keepdim=True)) / (h.std(-1, keepdim=True) + 1e-8) for h in hidden[1:]], -1)
        assert (emb.float() - want[0].float()).abs().max().item() <= 0.05  # bf16: a few ulps (0.0 here on CPU)
        real = int((ids[0] != tokenizer.pad_token_id).sum())
        pads = emb[real:].float()  # pad positions: real hidden states (no attention mask), not zeros...
        assert real < 512 and pads.abs().amax(-1).min().item() > 0.1
        assert not torch.equal(pads[0], pads[-1])  # ...that depend on the position (RoPE) and what came before
    # what training reads (clips/data.py, the agreed interface): the same tensors, every row unmasked
    for prompt in set(prompts):
        text.check_reason1_embedding(text.reason1_path(root, prompt), prompt, 512, LAYERS * WIDTH)
    neg, where = text.negative_embedding(root, 512, LAYERS * WIDTH, text_encoder="reason1")
    assert where == t5.negative_path(root, "reason1") and torch.equal(neg, read_reason1(where)[0])


def test_reason1_resumes_and_refuses_another_encoders_files(tmp_path, capsys):
    prompts = ["Place the red block in the bowl.", "Close the laptop lid"]
    root = manifest_folder(tmp_path, prompts)
    calls = []

    def fake_encode(batch):  # distinct bf16 [4, 6] per prompt
        calls.extend(batch)
        return [torch.full((4, 6), float(len(p)), dtype=torch.bfloat16) for p in batch]

    source = {"encoder": "nvidia/Cosmos-Reason1-7B", "revision": t5.REASON1_REVISION}
    with pytest.raises(ValueError, match="needs source"):
        t5.write_embeddings(root, fake_encode, encoder="reason1")
    assert t5.write_embeddings(root, fake_encode, 8, "reason1", source)["files"] == 3
    first = t5.reason1_path(root, prompts[0])
    before = open(first, "rb").read()
    os.remove(t5.reason1_path(root, prompts[1]))
    with open(first + ".tmp", "wb") as f:  # a killed earlier run's leftover does not count as written
        f.write(b"partial")
    calls.clear()
    counts = t5.write_embeddings(root, fake_encode, 8, "reason1", source)
    assert counts == {"videos": 2, "unique_prompts": 1, "files": 1} and calls == [prompts[1]]
    assert open(first, "rb").read() == before  # kept, not rewritten
    emb, meta = read_reason1(t5.reason1_path(root, prompts[1]))
    assert torch.equal(emb, torch.full((4, 6), float(len(prompts[1])), dtype=torch.bfloat16))
    assert meta["revision"] == t5.REASON1_REVISION
    with pytest.raises(ValueError, match="written by nvidia/Cosmos-Reason1-7B@3210bec0.*this run encodes with "
                                         "nobody/no-such-model@main"):
        t5.main([root, "--encoder", "reason1", "--model", "nobody/no-such-model"])
    # nothing left: the documented command line (default model and pin) runs without loading a model
    assert t5.main([root, "--encoder", "reason1", "--device", "cuda"]) == 0
    assert "'files': 0" in capsys.readouterr().out
    with open(first, "wb") as f:
        f.write(b"\0" * 10)
    with pytest.raises(ValueError, match="not a readable safetensors file.*delete it"):
        t5.pending(root, "reason1", source)
    with pytest.raises(ValueError, match="bf16 tensor"):
        t5.save_reason1(first, np.zeros((4, 6)), "p", source)


# ------------------------------------------------------------------------------------------- command line

def user_error(argv, capsys) -> str:
    """The one stderr line cli.main prints for a user error, in-process (exit code 2)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(lambda: t5.main(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{os.path.basename(sys.argv[0]) or 'nanocosmos'}: error: ")
    return err


def test_command_line(tmp_path, capsys):
    proc = subprocess.run([sys.executable, t5.__file__, tmp_path / "nothing", "--device", "cpu"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("t5.py: error: ") and "neither manifest.jsonl nor videos/ exists" in proc.stderr
    with pytest.raises(SystemExit):  # ROOT is required (argparse)
        t5.main([])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        t5.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--encoder STR t5 (Predict2" in help_text and "--batch INT" in help_text and "(default: 't5')" in help_text
    assert "3210bec0495fdc7a8d3dbb8d58da5711eab4b423" in help_text
    root = manifest_folder(tmp_path, ["open drawer"])
    assert "--encoder 'bert': choose one of t5, reason1" in user_error([root, "--encoder", "bert"], capsys)
    assert "--batch 0 must be >= 1" in user_error([root, "--batch", "0"], capsys)
    assert "no such folder, and not a hub id" in user_error([root, "--model", str(tmp_path / "no-model")], capsys)
    assert "is a local folder, which has no revisions" in user_error(
        [root, "--model", str(tmp_path), "--revision", "abc"], capsys)
    assert "a folder without config.json; give a downloaded checkpoint (huggingface-cli download " \
           "nvidia/Cosmos-Reason1-7B" in user_error([root, "--model", str(tmp_path), "--encoder", "reason1"], capsys)
    assert "no-such-root: neither manifest.jsonl nor videos/" in user_error(
        [str(tmp_path / "no-such-root"), "--encoder", "reason1"], capsys)
    t5.write_embeddings(root, lambda prompts: [np.ones((3, 1024))] * len(prompts))
    # nothing left to encode: the documented command line runs without loading a model (this one does not exist)
    assert t5.main([root, "--device", "cuda", "--model", "nobody/no-such-t5", "--batch", "8"]) == 0
    assert "'files': 0" in capsys.readouterr().out
    os.remove(os.path.join(root, "t5_xxl", "negative_prompt.pickle"))
    with open(tmp_path / "config.json", "w") as f:
        f.write("{}")
    with pytest.raises(ValueError, match="Unrecognized model in " + str(tmp_path)):  # now there is work: it loads
        t5.main([root, "--device", "cpu", "--model", str(tmp_path)])


def test_an_embedding_that_overflows_float16_is_refused_before_it_is_written(tmp_path):
    """T5 activations past float16's 65504 would be stored as Inf: refused naming the prompt, nothing written."""
    root = shutil.copytree(stitched(V30)[0], tmp_path / "grid")
    with pytest.raises(ValueError, match="holds NaN/Inf as float16: nothing written"):
        t5.write_embeddings(str(root), lambda prompts: [np.full((3, 16), 1e5, np.float32) for _ in prompts])
    assert not [n for n in os.listdir(root / "t5_xxl") if n.endswith(".pickle")]
