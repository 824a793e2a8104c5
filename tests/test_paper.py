"""The paper version (Algorithm 1, no cache) and the real loop give the same tokens for the same keys."""

import jax
import numpy as np
import pytest

import picospec
from picospec import paper

DRAFT, TARGET = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
PROMPT = picospec.load_tokenizer("tiny-target").encode("And God said").ids


@pytest.mark.parametrize("temperature", [pytest.param(0.0, marks=pytest.mark.slow), 1.0])  # 0: greedy identity covers it fast
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
def test_the_real_loop_is_the_paper_algorithm(temperature, seed):
    key = jax.random.key(seed)
    real, trace = picospec.speculative_sample(DRAFT, TARGET, PROMPT, 12, key, K=4, temperature=temperature)
    assert paper.speculative_sampling(DRAFT, TARGET, PROMPT, 12, key, K=4, temperature=temperature) == real.tolist()
    if temperature:  # sampled runs reject: the residual draw is part of what matches
        assert int(np.sum(np.asarray(trace.n_accepted)[:int(trace.n_steps)] < 4)) > 0


@pytest.mark.slow
def test_a_different_key_gives_different_tokens_in_both():
    """The control: the match above is not two samplers that ignore their keys."""
    a = paper.speculative_sampling(DRAFT, TARGET, PROMPT, 24, jax.random.key(0), K=4)
    b = paper.speculative_sampling(DRAFT, TARGET, PROMPT, 24, jax.random.key(1), K=4)
    assert a != b
