"""The ladder of verifiers (match, token, block): each lossless, proved by exact enumeration on a
4-token vocabulary and by sampling the real loop; and match <= token <= block in drafts kept."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import early_exit, random_model
from stats import FAIL, PASS, chi_square_p
from test_speculative import DRAFT, N_PATH, TARGET, speculative_triples, target_law

import picospec
from picospec import PicospecError, Sampling
from picospec.beyond.verifiers import RULES, block_residuals

V = 4
RESIDUALS = jax.jit(block_residuals)


def markov_tables(seed):
    """Draft and target laws of the next token given the previous one: P, Q [V, V]."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, 0.7), size=V), rng.dirichlet(np.full(V, 0.7), size=V)


def add(law, block, prob):
    law[block] = law.get(block, 0.0) + prob


def token_law(d, p, q):
    """One iteration's output blocks (kept drafts + one token) and their probabilities, by the token rule."""
    law, keep, K = {}, 1.0, len(d)
    for a in range(K):
        accept = min(1.0, q[a][d[a]] / p[a][d[a]])
        residual = np.maximum(q[a] - p[a], 0)
        for y in range(V):
            if keep * (1 - accept) > 0:
                add(law, d[:a] + (y,), keep * (1 - accept) * residual[y] / residual.sum())
        keep *= accept
    for y in range(V):
        add(law, d + (y,), keep * q[K][y])
    return law


def match_law(d, p, q):
    law, keep, K = {}, 1.0, len(d)
    for a in range(K):
        for y in range(V):
            if y != d[a]:
                add(law, d[:a] + (y,), keep * q[a][y])
        keep *= q[a][d[a]]
    for y in range(V):
        add(law, d + (y,), keep * q[K][y])
    return law


def block_law(d, p, q, weights=True):
    """By the block rule, with picospec's own w, h and residuals; weights=False: the control that
    drops the weights (every w_i = 1, so the residual is max(0, q - p))."""
    K = len(d)
    w, h, residual = (np.asarray(x, np.float64) for x in RESIDUALS(jnp.array(d), jnp.float32(p), jnp.float32(q)))
    if not weights:
        residual = np.maximum(q - np.concatenate([p, np.zeros((1, V))]), 0)
        r = residual.sum(-1)
        h = np.where(r > 0, 1.0, 0.0)
        h[K] = 1.0
    law = {}
    for tau in range(K + 1):  # tau: the largest i in 1..K with u_i < h_i, else 0
        chance = (h[tau] if tau else 1.0) * np.prod([1 - h[j] for j in range(tau + 1, K + 1)])
        extra = residual[tau] / residual[tau].sum() if residual[tau].sum() > 0 else q[tau]
        for y in range(V):
            if chance > 0:
                add(law, d[:tau] + (y,), chance * extra[y])
    return law


def iteration_law(rule, x, K, P, Q):
    """The law of one iteration's output block after last token x: drafts d ~ P, then the rule."""
    law = {}
    for d in itertools.product(range(V), repeat=K):
        prev = (x,) + d
        p = np.stack([P[prev[i]] for i in range(K)])  # [K, V]
        q = np.stack([Q[prev[i]] for i in range(K + 1)])  # [K+1, V]
        for block, prob in rule(d, p, q).items():
            add(law, block, np.prod([P[prev[i]][d[i]] for i in range(K)]) * prob)
    return law


def stream_law(rule, x, L, K, P, Q, memo, iteration=iteration_law):
    """The law of the first L tokens the loop generates after token x, iteration after iteration."""
    if L == 0:
        return {(): 1.0}
    if (x, L) not in memo:
        law = {}
        for block, prob in iteration(rule, x, K, P, Q).items():
            if len(block) >= L:
                add(law, block[:L], prob)
            else:
                for tail, p_tail in stream_law(rule, block[-1], L - len(block), K, P, Q, memo, iteration).items():
                    add(law, block + tail, prob * p_tail)
        memo[(x, L)] = law
    return memo[(x, L)]


def markov_target_law(x, L, Q):
    return {s: np.prod([Q[((x,) + s)[i]][s[i]] for i in range(L)]) for s in itertools.product(range(V), repeat=L)}


def law_error(rule, K, seed, L=4):
    P, Q = markov_tables(seed)
    law, target = stream_law(rule, 0, L, K, P, Q, {}), markov_target_law(0, L, Q)
    return max(abs(law.get(s, 0.0) - target[s]) for s in target)


def kept(rule, K, seed):
    """Expected drafts kept in one iteration."""
    P, Q = markov_tables(seed)
    return sum(prob * (len(block) - 1) for block, prob in iteration_law(rule, 0, K, P, Q).items())


@pytest.mark.parametrize("K", [2, 3])
def test_every_rule_gives_the_targets_law_exactly_and_block_keeps_the_most(K):
    for seed in range(3):
        for rule in (match_law, token_law, block_law):
            assert law_error(rule, K, seed) < 1e-6, (rule.__name__, seed)
        match, token, block = (kept(rule, K, seed) for rule in (match_law, token_law, block_law))
        assert match <= token <= block + 1e-7, (seed, match, token, block)
    # The control: block verification without its weights is not lossless.
    assert law_error(lambda d, p, q: block_law(d, p, q, weights=False), K, 0) > 1e-3


@pytest.mark.parametrize("rule, law", [("match", match_law), ("token", token_law), ("block", block_law)])
def test_each_rule_as_coded_draws_its_exact_law(rule, law):
    """The real function, sampled for one drafted block: (kept drafts, extra token) against the law above."""
    P, Q = markov_tables(1)
    d, K = (2, 0), 2
    p, q = np.stack([P[3], P[2]]), np.stack([Q[3], Q[2], Q[0]])
    run = jax.vmap(lambda k1, k2: RULES[rule](k1, k2, jnp.array(d), jnp.float32(p), jnp.float32(q))[:2])
    a, extra = run(jax.random.split(jax.random.key(0), 20_000), jax.random.split(jax.random.key(1), 20_000))
    cells = {block: i for i, block in enumerate(law(d, p, q))}
    index = np.array([cells[d[:int(n)] + (int(y),)] for n, y in zip(a, extra)])
    assert chi_square_p(index, np.array(list(law(d, p, q).values()))) > PASS


@pytest.mark.parametrize("rule", ["block", pytest.param("match", marks=pytest.mark.slow)])
def test_the_whole_loop_follows_the_target_joint_law_for_each_rule(rule):
    triples = speculative_triples(K=2, n=N_PATH, temperature=1.0, verify=rule)
    assert chi_square_p(triples, target_law(Sampling(1.0))) > PASS
    assert chi_square_p(triples, target_law(Sampling(1.0), DRAFT)) < FAIL  # the control: the draft's own law


@pytest.mark.parametrize("rule", ["match", "block"])
def test_greedy_is_the_targets_greedy_output_for_each_rule(rule):
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    draft = early_exit(target, 1)
    for seed, prompt in enumerate([[3], [1, 5, 9, 2], list(range(12))]):
        key = jax.random.key(seed)
        spec, trace = picospec.speculative_sample(draft, target, prompt, 30, key, K=3, temperature=0, verify=rule)
        np.testing.assert_array_equal(spec, picospec.autoregressive_sample(target, prompt, 30, key, temperature=0))


def test_block_traces_its_weights_and_an_unknown_rule_is_refused():
    _, trace = picospec.speculative_sample(DRAFT, TARGET, [1, 4], 8, jax.random.key(0), K=3, verify="block")
    w, h = np.asarray(trace.w[0]), np.asarray(trace.h[0])
    assert (0 < w).all() and (w <= 1).all() and (0 <= h).all() and (h <= 1).all()
    assert np.isclose(h[-1], w[-1])  # h_K = w_K
    _, token = picospec.speculative_sample(DRAFT, TARGET, [1, 4], 8, jax.random.key(0), K=3)
    assert not np.asarray(token.w).any()
    with pytest.raises(PicospecError, match="unknown verifier 'blok'; use one of match, token, block"):
        picospec.speculative_sample(DRAFT, TARGET, [1, 4], 8, jax.random.key(0), K=3, verify="blok")
