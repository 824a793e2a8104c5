"""The forward pass: parity with transformers, and the KV cache's equivalence to a full pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import DATA, random_model
from safetensors.numpy import load_file

import picospec
from picospec.gpt2 import forward, init_cache

CHECKPOINTS = ["tiny-prefixed", "tiny-hub", "tiny-sharded"]  # transformers' layout, the hub's (odd head count), shards


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_logits_match_committed_transformers_logits(name):
    model = picospec.load_model(str(DATA / name))
    ref = load_file(DATA / name / "reference.safetensors")
    for tokens, expected in zip(ref["tokens"], ref["logits"]):
        np.testing.assert_allclose(picospec.logits(model, tokens), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_logits_match_live_transformers(name):
    torch = pytest.importorskip("torch")  # optional: the committed logits above always run
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(DATA / name).eval()
    tokens = np.random.default_rng(5).integers(0, hf.config.vocab_size, 50)
    with torch.no_grad():
        expected = hf(torch.from_numpy(tokens)[None]).logits[0].numpy()
    np.testing.assert_allclose(picospec.logits(picospec.load_model(str(DATA / name)), tokens),
                               expected, atol=1e-4, rtol=0)


def test_the_reference_logits_are_not_trivial():
    # A control for the parity tests: a different checkpoint gives clearly different logits.
    ref = load_file(DATA / "tiny-hub" / "reference.safetensors")
    other = picospec.load_model(str(DATA / "tiny-prefixed"))
    assert np.abs(picospec.logits(other, ref["tokens"][0]) - ref["logits"][0]).max() > 0.1


def test_cache_decoding_equals_full_forward_pass_with_rollback():
    model = random_model(n_head=3, n_embd=24)
    tokens = jax.random.randint(jax.random.key(1), (30,), 0, model.config.vocab_size)
    full = picospec.logits(model, tokens)  # [30, V]
    p, c = model.params, model.config
    cache = init_cache(c)
    got = []
    out, cache = forward(model, tokens[:7], cache)  # prompt
    got.append(out)
    for i in range(7, 10):  # one token at a time
        out, cache = forward(model, tokens[i:i + 1], cache)
        got.append(out)
    # Feed 3 wrong tokens, then roll back by moving the length: their stale slots must not leak.
    junk = (tokens[10:13] + 1) % c.vocab_size
    _, cache = forward(model, junk, cache)
    cache = cache._replace(length=cache.length - 3)
    for i in range(10, 28, 3):  # blocks of 3 (as a K=2 verification would feed)
        out, cache = forward(model, tokens[i:i + 3], cache)
        got.append(out)
    out, cache = forward(model, tokens[28:30], cache)
    got.append(out)
    assert int(cache.length) == 30
    np.testing.assert_allclose(jnp.concatenate(got), full, atol=1e-5)


def test_decoding_at_new_positions_compiles_nothing_new(compiles):
    model = random_model(seed=3)
    p, c = model.params, model.config
    cache = init_cache(c)
    _, cache = forward(model, jnp.zeros(1, jnp.int32), cache)  # warm up both shapes
    _, cache = forward(model, jnp.zeros(5, jnp.int32), cache)
    cache = cache._replace(length=cache.length - 2)  # and the rollback's subtraction (a test before may not have)
    before = compiles.count
    for _ in range(5):
        _, cache = forward(model, jnp.ones(1, jnp.int32), cache)
        _, cache = forward(model, jnp.ones(5, jnp.int32), cache)
        cache = cache._replace(length=cache.length - 2)
    assert compiles.count == before
    # The control: a new block size does compile, so the counter sees compilations.
    forward(model, jnp.ones(3, jnp.int32), cache)
    assert compiles.count > before


def test_bfloat16_model_stays_close_to_float32():
    f32 = picospec.load_model(str(DATA / "tiny-hub"))
    bf16 = picospec.load_model(str(DATA / "tiny-hub"), dtype="bfloat16")
    assert bf16.params["h"][0]["mlp"]["c_fc"]["weight"].dtype == jnp.bfloat16
    tokens = np.arange(20)
    a, b = picospec.logits(f32, tokens), picospec.logits(bf16, tokens)
    assert b.dtype == jnp.float32
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max()
    assert np.abs(a - b).max() > 0  # it really ran in lower precision


def test_logits_past_the_context_is_refused():
    model = random_model(n_positions=8)
    assert picospec.logits(model, list(range(8))).shape[0] == 8
    with pytest.raises(picospec.PicospecError, match="logits takes 1 to 8 tokens .the model's context., got 9"):
        picospec.logits(model, list(range(9)))
