"""The bundled pair, weights/tiny-draft and weights/tiny-target: real learned models, found by name."""

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import random_model
from safetensors import safe_open

import picospec
from picospec.tools.train import STORED, loss_fn

WEIGHTS = Path(__file__).parent.parent / "weights"
HELD_OUT = (WEIGHTS / "heldout_sample.txt").read_text().split("\n<|endoftext|>")
DRAFT, TARGET = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
TOKENIZER = picospec.load_tokenizer("tiny-target")


def test_names_resolve_from_any_directory(tmp_path):
    code = "import picospec; m = picospec.load_model('tiny-target'); print(m.config.n_layer)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == TARGET.config.n_layer


def test_hugging_face_layout_file_dtype_and_size():
    for name, model in (("tiny-draft", DRAFT), ("tiny-target", TARGET)):
        assert sorted(p.name for p in (WEIGHTS / name).iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
        with safe_open(WEIGHTS / name / "model.safetensors", "numpy") as f:  # stored as train.py says ...
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32" if STORED == np.float32 else "F16"}
        assert {x.dtype for x in jax.tree_util.tree_leaves(model.params)} == {np.dtype("float32")}  # ... run as float32
    head = sorted(p.name for p in (WEIGHTS / "tiny-head").iterdir())
    assert head == ["config.json", "loss.png", "model.safetensors", "training_report.json"]
    total = sum(p.stat().st_size for p in WEIGHTS.glob("tiny-*/*"))
    assert total < 33e6  # the pair (27.5 MB) and the EAGLE head (4.2 MB)


def per_token_cost(config):  # multiply-adds per token: the blocks plus the LM head
    return 12 * config.n_layer * config.n_embd ** 2 + config.vocab_size * config.n_embd


def test_draft_costs_at_most_a_fifth_of_the_target():
    assert DRAFT.config.vocab_size == TARGET.config.vocab_size == TOKENIZER.get_vocab_size()
    assert per_token_cost(DRAFT.config) <= per_token_cost(TARGET.config) / 5


def held_out_loss(model, windows):
    return float(loss_fn(model.params, model.config, windows))


def test_target_perplexity_is_clearly_below_the_draft_on_held_out_text():
    tokens = np.array(TOKENIZER.encode("\n".join(HELD_OUT)).ids)
    windows = np.stack([tokens[i:i + 129] for i in range(0, len(tokens) - 129, 128)])[:32]
    target, draft = np.exp(held_out_loss(TARGET, windows)), np.exp(held_out_loss(DRAFT, windows))
    untrained = np.exp(held_out_loss(random_model(vocab_size=TARGET.config.vocab_size, n_positions=256, std=0.02), windows))
    assert target < 0.95 * draft < 0.5 * untrained, (target, draft, untrained)


def held_out_prompts(n=12, length=24):
    tokens = [TOKENIZER.encode(chapter).ids for chapter in HELD_OUT]
    return [t[i * 50:i * 50 + length] for t in tokens for i in range(2)][:n]


@pytest.mark.slow  # the perplexity and English tests keep the pair's quality in the fast suite
def test_acceptance_rate_at_temperature_0_with_K4_is_at_least_0_6():
    accepted = drafted = 0
    for prompt in held_out_prompts():
        _, trace = picospec.speculative_sample(DRAFT, TARGET, prompt, 48, jax.random.key(0), K=4, temperature=0)
        accepted += int(trace.n_accepted.sum())
        drafted += 4 * int(trace.n_steps)
    assert accepted / drafted >= 0.6, accepted / drafted


def words(text):
    return [w.strip(".,;:!?'\"()").lower() for w in text.split()]


KNOWN = set(words(" ".join(HELD_OUT)))  # the English words of a few unseen chapters


def english_words(text):
    return sum(w in KNOWN for w in words(text)), len(words(text))


def test_generated_text_is_recognisably_english_and_a_random_model_is_not():
    prompt = TOKENIZER.encode("And God said").ids
    tokens, _ = picospec.speculative_sample(DRAFT, TARGET, prompt, 60, jax.random.key(1), K=4, temperature=0.8)
    common, total = english_words(TOKENIZER.decode(tokens.tolist()))
    assert total >= 20 and common / total >= 0.7
    # The control: the same check fails on an untrained model of the same shape.
    untrained = random_model(vocab_size=TARGET.config.vocab_size, n_positions=256, std=0.02, n_embd=32)
    noise = picospec.autoregressive_sample(untrained, prompt, 60, jax.random.key(1))
    common, total = english_words(TOKENIZER.decode(noise.tolist()))
    assert common / max(total, 1) < 0.3, (common, total)


def test_transformers_loads_the_bundled_pair_and_agrees():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokens = np.array(TOKENIZER.encode(HELD_OUT[0][:300]).ids)
    for name, model in (("tiny-draft", DRAFT), ("tiny-target", TARGET)):
        hf = transformers.GPT2LMHeadModel.from_pretrained(WEIGHTS / name, dtype=torch.float32).eval()
        with torch.no_grad():
            expected = hf(torch.from_numpy(tokens)[None]).logits[0].numpy()
        np.testing.assert_allclose(picospec.logits(model, tokens), expected, atol=1e-3, rtol=1e-4)
