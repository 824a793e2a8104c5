"""A caller's jax.random key stays the caller's: no public entry point donates or deletes it, and the
same key gives the same tokens when used again."""

import jax
import numpy as np
import pytest
from conftest import early_exit, random_model

import picospec
from picospec.paper import speculative_sampling
from picospec.sampling import Sampling
from picospec.tools.cli.stream import stream

TARGET = random_model(n_layer=2, vocab_size=16)
DRAFT = early_exit(TARGET, 1)
PROMPTS = [[1, 2, 3], [4, 5]]


def batch_keys():
    return jax.random.split(jax.random.key(0), len(PROMPTS))


def streamed(draft, keys):
    return [step for iteration in stream(draft, TARGET, PROMPTS, 6, keys, K=3, sampling=Sampling(0.8))
            for step in iteration if step is not None]


ENTRY_POINTS = {
    "speculative_sample": (jax.random.key(0), lambda k: picospec.speculative_sample(DRAFT, TARGET, [1, 2], 6, k, K=3)[0]),
    "autoregressive_sample": (jax.random.key(0), lambda k: picospec.autoregressive_sample(TARGET, [1, 2], 6, k)),
    "speculative_sample_batch": (batch_keys(), lambda k: picospec.speculative_sample_batch(DRAFT, TARGET, PROMPTS, 6, k,
                                                                                           K=3)[0]),
    "autoregressive_sample_batch": (batch_keys(), lambda k: picospec.autoregressive_sample_batch(TARGET, PROMPTS, 6, k)),
    "stream, speculative": (batch_keys(), lambda k: [s.tokens for s in streamed(DRAFT, k)]),
    "stream, autoregressive": (batch_keys(), lambda k: [s.tokens for s in streamed(None, k)]),
    "paper version": (jax.random.key(0), lambda k: speculative_sampling(DRAFT, TARGET, [1, 2], 3, k, K=2)),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "paper version" else n
                                  for n in ENTRY_POINTS])
def test_the_callers_key_is_neither_donated_nor_deleted(name):
    key, run = ENTRY_POINTS[name]
    first = run(key)
    assert not key.is_deleted(), name
    np.testing.assert_array_equal(np.asarray(run(key), dtype=object), np.asarray(first, dtype=object))


def test_control_a_donated_key_is_deleted():
    """The check above can fail: a function that donates its key deletes the caller's."""
    key = jax.random.key(0)
    jax.jit(lambda k: jax.random.split(k)[0], donate_argnums=0)(key)
    assert key.is_deleted()
