"""Standardized sampling (temperature, top-k, top-p) and the autoregressive sampler."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_model
from stats import PASS, chi_square_p

import picospec
from picospec import PicospecError, Sampling
from picospec.sampling import logits_to_probs, sample
from picospec.tools import checks

LOGITS = jnp.array([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])


def test_temperature_zero_is_exactly_one_hot_argmax():
    probs = logits_to_probs(LOGITS, Sampling(temperature=0.0))
    np.testing.assert_array_equal(probs, np.eye(6)[5])


def test_temperature_scales_logits_before_softmax():
    np.testing.assert_allclose(logits_to_probs(LOGITS, Sampling(0.5)), jax.nn.softmax(LOGITS / 0.5), rtol=1e-6)


def test_top_k_keeps_the_k_most_likely():
    probs = logits_to_probs(LOGITS, Sampling(1.0, top_k=2))
    expected = np.zeros(6)
    expected[[0, 5]] = jax.nn.softmax(jnp.array([2.0, 3.0]))
    np.testing.assert_allclose(probs, expected, rtol=1e-6)


def test_top_p_keeps_the_fewest_tokens_reaching_the_mass():
    full = np.asarray(jax.nn.softmax(LOGITS))  # sorted: 5 (0.61), 0 (0.22), 1 (0.08), ...
    probs = logits_to_probs(LOGITS, Sampling(1.0, top_p=0.7))
    kept = np.zeros(6)
    kept[[5, 0]] = full[[5, 0]]
    np.testing.assert_allclose(probs, kept / kept.sum(), rtol=1e-6)
    np.testing.assert_allclose(logits_to_probs(LOGITS, Sampling(1.0, top_p=0.5)), np.eye(6)[5], rtol=1e-6)


def test_top_k_then_top_p_compose_in_that_order():
    # top-k=3 renormalizes over {5, 0, 1}; top-p=0.9 of *that* drops token 1 (0.66 + 0.24 >= 0.9).
    probs = logits_to_probs(LOGITS, Sampling(1.0, top_k=3, top_p=0.9))
    assert np.count_nonzero(probs) == 2 and probs[5] > probs[0] > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(top_k=-2), "top-k must be a whole number >= 0"),
    (dict(top_p=0.0), r"top-p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top-p must be in \(0, 1\]"),
])
def test_bad_sampling_options_are_refused(kwargs, message):
    with pytest.raises(PicospecError, match=message):
        checks.sampling(**kwargs)


def test_autoregressive_first_token_follows_the_model_law():
    model = random_model(seed=4, vocab_size=6)
    prompt = [1, 2]
    sampling = Sampling(0.8, top_k=4)
    law = logits_to_probs(picospec.logits(model, prompt)[-1], sampling)
    keys = jax.random.split(jax.random.key(0), 8000)
    first = jax.vmap(lambda k: picospec.autoregressive_sample(model, prompt, 1, k, temperature=0.8, top_k=4))(keys)
    assert chi_square_p(first, law) > PASS


def test_autoregressive_greedy_matches_argmax_of_full_forward():
    model = random_model(seed=5)
    tokens = [3, 1, 4]
    out = np.asarray(picospec.autoregressive_sample(model, tokens, 12, jax.random.key(0), temperature=0))
    full = picospec.logits(model, tokens + out.tolist())  # one causal pass: row i predicts token i + 1
    for i, t in enumerate(out):  # each token is the argmax after everything before it
        assert t == int(jnp.argmax(full[len(tokens) - 1 + i]))


def test_stop_at_eos_pads_with_eos_and_otherwise_runs_on():
    model = random_model(seed=6, vocab_size=4)  # eos is token 3: it comes up soon
    eos = model.config.eos_token_id
    out = np.asarray(picospec.autoregressive_sample(model, [0], 40, jax.random.key(1), stop_at_eos=True))
    first = int(np.argmax(out == eos))
    assert out[first] == eos and (out[first:] == eos).all() and first < 39
    free = np.asarray(picospec.autoregressive_sample(model, [0], 40, jax.random.key(1)))
    np.testing.assert_array_equal(free[:first + 1], out[:first + 1])  # the same key, the same start
    assert (free[first:] != eos).any()


def test_context_overflow_and_empty_prompt_are_refused():
    model = random_model(n_positions=32)
    with pytest.raises(PicospecError, match="exceeds the model's context of 32"):
        picospec.autoregressive_sample(model, [1] * 20, 14, jax.random.key(0))
    picospec.autoregressive_sample(model, [1] * 20, 13, jax.random.key(0))  # exactly fits
    with pytest.raises(PicospecError, match="prompt is empty"):
        picospec.autoregressive_sample(model, [], 5, jax.random.key(0))
    with pytest.raises(PicospecError, match="n-tokens must be >= 1"):
        picospec.autoregressive_sample(model, [1], 0, jax.random.key(0))


def test_sample_draws_the_law_and_never_a_zero_probability_token():
    probs = jnp.array([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    draws = jax.vmap(lambda k: sample(k, probs))(jax.random.split(jax.random.key(3), 20000))
    assert chi_square_p(draws, probs) > PASS  # also asserts no zero-probability token was drawn
    one_hot = jnp.eye(6)[4]
    assert int(sample(jax.random.key(0), one_hot, greedy=True)) == 4
    assert (jax.vmap(lambda k: sample(k, one_hot))(jax.random.split(jax.random.key(1), 500)) == 4).all()


def test_numpy_integers_are_whole_numbers_for_top_k():
    sampling = checks.sampling(1, np.int64(3))
    assert sampling == Sampling(1.0, 3) and type(sampling.top_k) is int and type(sampling.temperature) is float
    assert hash(sampling) == hash(Sampling(1.0, 3))
    with pytest.raises(PicospecError, match="top-k must be a whole number"):
        checks.sampling(1.0, 2.5)


def test_a_new_temperature_top_k_or_top_p_compiles_nothing(compiles):
    """temperature, top-k and top-p are traced values; only whether each applies is static: greedy
    (temperature 0), top-k on (> 0), top-p on (< 1). A run-time branch on them would make every draft step
    wait for the host on a GPU (tests/test_round_trips.py)."""
    target = random_model(vocab_size=12)
    draft = random_model(seed=1, n_layer=1, vocab_size=12)
    key = jax.random.key(0)

    def run(**kw):
        picospec.speculative_sample(draft, target, [1, 2], 6, key, K=3, **kw)[0].block_until_ready()
        picospec.autoregressive_sample(target, [1, 2], 6, key, **kw).block_until_ready()

    run(temperature=0.8, top_k=3, top_p=0.8)
    before = compiles.count
    for kw in (dict(temperature=0.5, top_k=5, top_p=0.5), dict(temperature=1, top_k=2, top_p=0.9),
               dict(temperature=2.0, top_k=7, top_p=0.3)):
        run(**kw)
    assert compiles.count == before
    # The controls: the counter does see a compile for each static switch.
    for kw in (dict(temperature=0.8, top_p=0.8), dict(temperature=0.8, top_k=3), dict(temperature=0)):
        run(**kw)
        assert compiles.count > before
        before = compiles.count


def test_traced_top_k_and_top_p_match_the_definition_under_jit():
    for k, p in [(2, 1.0), (3, 0.9), (6, 0.5), (10, 1.0)]:
        jitted = jax.jit(logits_to_probs)(LOGITS, Sampling(1.0, k, p))
        np.testing.assert_allclose(jitted, logits_to_probs(LOGITS, Sampling(1.0, k, p)), rtol=1e-6)
    assert int((jax.jit(logits_to_probs)(LOGITS, Sampling(1.0, 2)) > 0).sum()) == 2
