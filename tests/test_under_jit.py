"""Both samplers are pure functions of a key: every keyword the README offers (verify=, drafts=, policy=,
tree=) runs under jax.jit and jax.vmap, with a model draft and with an EAGLE head, and gives the tokens the
same call gives on its own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import early_exit
from test_eagle import TARGET, toy_head

import picospec
from picospec.beyond.dynamic import Grown
from picospec.beyond.policy import Policy
from picospec.beyond.tree import Shape

HEAD, DRAFT = toy_head(), early_exit(TARGET, 1)  # an EAGLE head, and a model draft (the target's first block)


def auto():  # --K auto's policy, as the README's example makes it (inside the jitted function)
    return Policy(jnp.float32(0), jnp.float32([1.2, 1.0, 1.05, 1.1]), jnp.float32(0))


KEYWORDS = {  # name: (draft kind, keyword arguments of speculative_sample)
    "verify=block": ("model", lambda: dict(K=3, verify="block")),
    "drafts=2": ("model", lambda: dict(K=2, drafts=2)),
    "policy": ("model", lambda: dict(K=3, policy=auto())),
    "tree=Shape": ("model", lambda: dict(tree=Shape((0, 0, 1)))),
    "tree=Grown": ("model", lambda: dict(tree=Grown(3, 2, 2))),
    "head, policy": ("head", lambda: dict(K=3, policy=auto())),
    "head, tree=Shape": ("head", lambda: dict(tree=Shape((0, 0, 1)))),
}


def test_a_policy_runs_under_jit_with_the_same_tokens():
    """The README's example that broke (TracerBoolConversionError): a policy made inside the jitted call."""
    def run(key):
        return picospec.speculative_sample(DRAFT, TARGET, [1, 2], 6, key, K=3, temperature=1.0, policy=auto())[0]
    np.testing.assert_array_equal(jax.jit(run)(jax.random.key(0)), run(jax.random.key(0)))


@pytest.mark.slow  # ~10 s each: three programs of the loop
@pytest.mark.parametrize("name", KEYWORDS)
def test_every_keyword_runs_under_jit_and_vmap_with_the_same_tokens(name):
    kind, keywords = KEYWORDS[name]
    draft = HEAD if kind == "head" else DRAFT

    def run(key):
        return picospec.speculative_sample(draft, TARGET, [1, 2], 6, key, temperature=1.0, **keywords())[0]
    keys = jax.random.split(jax.random.key(0), 2)
    alone = [np.asarray(run(key)) for key in keys]
    np.testing.assert_array_equal(jax.jit(run)(keys[0]), alone[0])
    np.testing.assert_array_equal(jax.vmap(run)(keys), np.stack(alone))


def test_a_policy_passed_in_traced_runs_the_loop_with_the_same_tokens():
    """A policy whose arrays an outer jit traces cannot be read on the host: whether its prior alone stops
    the draft is left to the loop, which gives the same tokens (the control: the policy as a constant)."""
    draft = DRAFT

    def run(key, v):
        policy = Policy(jnp.float32(0), v, jnp.float32(0))
        return picospec.speculative_sample(draft, TARGET, [1, 2], 6, key, K=3, temperature=1.0, policy=policy)[0]
    v, key = jnp.float32([1.2, 1.0, 1.05, 1.1]), jax.random.key(3)
    np.testing.assert_array_equal(jax.jit(run)(key, v), run(key, v))
