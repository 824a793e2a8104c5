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
    (temperature 0), top-k on (its bound: every top-k up to 64 shares one), top-p on (< 1). A run-time
    branch on them would make every draft step wait for the host on a GPU (tests/test_round_trips.py)."""
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
    for kw in (dict(temperature=0.8, top_p=0.8), dict(temperature=0.8, top_k=3), dict(temperature=0),
               dict(temperature=0.8, top_k=65, top_p=0.8)):
        run(**kw)
        assert compiles.count > before
        before = compiles.count


def by_sorting(logits, k: int, p: float):  # [..., V]: the definition, on the whole vocabulary sorted (numpy)
    logits = np.asarray(logits, np.float64)
    if k:
        kth = -np.sort(-logits, axis=-1)[..., min(k, logits.shape[-1]) - 1, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if p < 1:
        desc = -np.sort(-probs, axis=-1)
        before = np.cumsum(desc, axis=-1) - desc  # the mass of the tokens more likely than each
        cutoff = np.where(before < p, desc, 1.0).min(-1, keepdims=True)
        probs = np.where(probs >= cutoff, probs, 0.0)
        probs /= probs.sum(-1, keepdims=True)
    return probs


@pytest.mark.parametrize("V", [50, 300])
def test_top_k_and_top_p_from_the_largest_are_the_definition_on_the_sorted_vocabulary(V):
    """top-k and top-p find the k-th largest and the nucleus with lax.top_k of k_bound (64, or a power
    of two), not a sort of the vocabulary: the same tokens kept, and the same law, as the definition
    on the whole vocabulary sorted, for k below and past the bound, and logits rounded to a coarse grid
    so that many tie, at the k-th largest too (ties with it are kept, past the bound as well)."""
    rng = np.random.default_rng(0)
    logits = np.round(rng.normal(size=(40, V)) * 2) / 2  # [40, V], heavy ties
    logits[:, :70] = 1.0  # 70 tokens tie for the largest: past a bound of 64
    for k, p in [(1, 1.0), (5, 1.0), (20, 0.9), (64, 0.5), (65, 0.99), (100, 1.0), (0, 0.8), (3, 0.3)]:
        ours = np.asarray(logits_to_probs(jnp.float32(logits), Sampling(1.0, k, p)))
        want = by_sorting(logits, k, p)
        np.testing.assert_array_equal(ours > 0, want > 0, err_msg=f"k={k} p={p}")
        np.testing.assert_allclose(ours, want, atol=1e-6, err_msg=f"k={k} p={p}")
    assert Sampling(1.0, 20).k_bound == Sampling(1.0, 64).k_bound == 64 and Sampling(1.0, 65).k_bound == 128


def test_top_k_sorts_no_vocabulary():
    """With top-k on, the program holds no sort of the vocabulary (lax.top_k instead; with top-p, the
    nucleus is found among the k_bound largest); the control: top-p alone still sorts it."""
    def ops(**kw):
        return jax.jit(logits_to_probs).lower(jnp.zeros((5, 2048)), Sampling(0.8, **kw)).as_text()
    assert "stablehlo.sort" not in ops(top_k=20, top_p=0.9) and "stablehlo.sort" not in ops(top_k=20)
    assert "top_k" in ops(top_k=20, top_p=0.9) and "stablehlo.sort" in ops(top_p=0.9)


def test_traced_top_k_and_top_p_match_the_definition_under_jit():
    for k, p in [(2, 1.0), (3, 0.9), (6, 0.5), (10, 1.0)]:
        jitted = jax.jit(logits_to_probs)(LOGITS, Sampling(1.0, k, p))
        np.testing.assert_allclose(jitted, logits_to_probs(LOGITS, Sampling(1.0, k, p)), rtol=1e-6)
    assert int((jax.jit(logits_to_probs)(LOGITS, Sampling(1.0, 2)) > 0).sum()) == 2
