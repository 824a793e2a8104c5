"""The n-gram draft: lookup edge cases, greedy identity, and the same lossless law."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_model
from stats import PASS, chi_square_p
from test_speculative import N_PATH, PROMPT, TARGET, V, target_law

import picospec
from picospec import NGramDraft, Sampling
from picospec.beyond.ngram import lookup
from picospec.tools.cli.show import HTML_COLOURS, coloured_text, decisions, extra_kind
from picospec.tools.cli.steps import Step


def propose(sequence, max_n=3, K=4):
    tokens = jnp.zeros(64, jnp.int32).at[:len(sequence)].set(jnp.array(sequence))
    drafted, found = lookup(tokens, jnp.int32(len(sequence)), max_n, K)
    return drafted.tolist(), bool(found)


def test_proposes_what_followed_the_latest_occurrence():
    assert propose([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]) == ([7, 5, 1, 2], True)  # the later of two


def test_longest_ngram_wins():
    # "3" alone last occurred before 8; the 2-gram "2 3" last occurred before 4.
    assert propose([2, 3, 4, 4, 0, 3, 8, 2, 3], max_n=2) == ([4, 4, 0, 3], True)
    assert propose([2, 3, 4, 4, 0, 3, 8, 2, 3], max_n=1) == ([8, 2, 3, 8], True)


def test_no_match_proposes_nothing():
    assert propose([1, 2, 3, 4, 5])[1] is False
    assert propose([7])[1] is False


def test_match_at_the_very_end_repeats():
    assert propose([5, 6, 6]) == ([6, 6, 6, 6], True)  # "6" occurred just before: a run of 6s


def test_overlapping_match_continues_periodically():
    # "a b a b a": the tail "a b a" occurs at 0, overlapping itself; what followed repeats "b a".
    assert propose([1, 2, 1, 2, 1], max_n=3, K=5) == ([2, 1, 2, 1, 2], True)


def test_stale_slots_beyond_the_sequence_are_ignored():
    tokens = jnp.array([4, 5, 9, 9, 4, 5] + [9] * 10, jnp.int32)  # junk 9s after n = 6
    drafted, found = lookup(tokens, jnp.int32(6), 2, 3)
    assert bool(found) and drafted.tolist() == [9, 9, 4]  # from the real "9 9" after the first "4 5"


@pytest.mark.parametrize("K", [pytest.param(1, marks=pytest.mark.slow), 3, pytest.param(5, marks=pytest.mark.slow)])
def test_greedy_with_ngram_draft_equals_target_alone(K):
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    rng = np.random.default_rng(K)
    proposed = 0
    for _ in range(8):
        prompt = list(rng.integers(0, 4, rng.choice([2, 29])))  # a small alphabet: many repeats; two lengths, two compiles
        key = jax.random.key(int(rng.integers(1 << 30)))
        spec, trace = picospec.speculative_sample(NGramDraft(3), target, prompt, 40, key, K=K, temperature=0)
        np.testing.assert_array_equal(spec, picospec.autoregressive_sample(target, prompt, 40, key, temperature=0))
        proposed += int(trace.proposed[:int(trace.n_steps)].sum())
    assert proposed > 0


@pytest.mark.parametrize("kw", [dict(K=2, temperature=1.0),
                                pytest.param(dict(K=3, temperature=0.7, top_k=4), marks=pytest.mark.slow)])
def test_ngram_draft_keeps_the_target_joint_law(kw):
    prompt = PROMPT + PROMPT + [1]  # the tail "1" has occurred: lookups will find matches
    keys = jax.random.split(jax.random.key(4), N_PATH)
    out, traces = jax.vmap(lambda k: picospec.speculative_sample(NGramDraft(2), TARGET, prompt, 3, k, **kw))(keys)
    assert traces.proposed.any() and traces.n_accepted.any()  # the draft was used, and sometimes right
    sampling = Sampling(kw["temperature"], kw.get("top_k", 0))
    law = target_law(sampling, prompt=prompt)
    assert chi_square_p(np.asarray(out) @ np.array([V * V, V, 1]), law) > PASS


def test_display_names_a_plain_target_step_target_not_resample():
    class Letters:  # a stand-in tokenizer: token t is the letter chr(97 + t)
        def decode(self, tokens):
            return "".join(chr(97 + t) for t in tokens)
    plain, resampled = Step([2], proposed=False), Step([1, 2], drafted=[1, 3], accepted=1, p=[.5, .5], q=[.5, .1],
                                                       u=[.1, .9])
    assert (extra_kind(plain), extra_kind(resampled)) == ("target", "resample")
    assert decisions(plain, Letters()).endswith("target") and "resample" not in decisions(plain, Letters())
    assert decisions(resampled, Letters()).endswith("resample")
    text = coloured_text([plain], Letters())
    assert HTML_COLOURS["target"] in text and HTML_COLOURS["resample"] not in text
    text = coloured_text([resampled], Letters())  # the rejected guess d_1 = "d", struck through, then "c"
    assert '<s style="background:#f7c5c5">d</s><span style="background:#fbe7a1">c</span>' in text
