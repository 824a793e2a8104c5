"""Dynamic token trees (EAGLE-2's expand and rerank): the tree the draft grows matches a reference written
out here; verified as deterministic ("top") children, the law of the first tokens is exactly the target's
(enumerated on a 4-token Markov pair, with a control verifying them as drawn from p); the real loop's
joint law (chi-square) and its greedy output."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import early_exit, random_model
from stats import FAIL, PASS, chi_square_p
from test_speculative import DRAFT, TARGET, speculative_triples, target_law
from test_tree import tree_law
from test_verifiers import add, markov_tables, markov_target_law, stream_law

import picospec
from picospec import PicospecError, Sampling
from picospec.beyond.dynamic import DynamicDraft, Grown, calibration, grown
from picospec.beyond.loop import ModelDraft, start
from picospec.beyond.tree import Shape
from picospec.sampling import logits_to_probs


def reference_tree(budget: Grown, x, law_after):
    """EAGLE-2 written out: W best children per frontier node, the W best paths a depth, then the M most
    confident nodes, in the order grown. law_after(path): the draft's law after the path's tokens.
    Returns the kept tree's tokens (x first) and parents."""
    M, W, D, table = budget
    a = (lambda c: c) if table is None else lambda c: np.clip(  # noqa: E731  dynamic.calibrated, in numpy
        np.interp(c, (np.arange(len(table)) + 0.5) / len(table), table) + 1e-4 * c, 1e-6, 0.999)
    nodes, frontier = [], [-1]  # (tokens from x, log confidence, parent: an index in nodes, -1 the root)
    for _ in range(D):
        offers = []
        for f in frontier:
            path, c = ((x,), 0.0) if f < 0 else nodes[f][:2]
            p = law_after(path)
            offers += [(path + (int(t),), c + np.log(a(p[t])), f) for t in np.argsort(-p, kind="stable")[:W]]
        frontier = list(range(len(nodes), len(nodes) + W))
        nodes += sorted(offers, key=lambda offer: -offer[1])[:W]  # a stable sort: ties in the order offered
    kept = sorted(sorted(range(len(nodes)), key=lambda i: -nodes[i][1])[:M])
    tokens = (x,) + tuple(nodes[i][0][-1] for i in kept)
    return tokens, tuple(0 if nodes[i][2] < 0 else 1 + kept.index(nodes[i][2]) for i in kept)


def dynamic_iteration(budget, verified_as="top"):
    def iteration(rule, x, K, P, Q):
        tokens, parents = reference_tree(budget, x, lambda path: P[path[-1]])
        law = {}
        for block, prob in tree_law(Shape(parents), verified_as, tokens, P, Q).items():
            add(law, block, prob)
        return law
    return iteration


def law_error(budget, seed, verified_as="top", L=3):
    P, Q = markov_tables(seed)
    law = stream_law(None, 0, L, None, P, Q, {}, dynamic_iteration(budget, verified_as))
    target = markov_target_law(0, L, Q)
    return max(abs(law.get(s, 0.0) - target[s]) for s in target)


CONCAVE = (0.3, 0.8, 0.9, 0.93, 0.95, 0.96, 0.97, 0.98, 0.98, 0.99)  # a calibration: guesses better than p says


@pytest.mark.parametrize("budget", [Grown(3, 2, 2), Grown(4, 3, 2), Grown(3, 2, 3), Grown(3, 2, 3, CONCAVE)])
def test_the_dynamic_tree_verified_as_top_children_gives_the_targets_law_exactly(budget):
    for seed in (0, 1, 2):
        assert law_error(budget, seed) < 1e-6, seed
    assert law_error(budget, 0, verified_as="iid") > 1e-3  # the control: its children taken for draws from p


@pytest.mark.parametrize("budget", [pytest.param(Grown(6, 3, 3), marks=pytest.mark.slow), Grown(6, 3, 3, CONCAVE),
                                    pytest.param(Grown(4, 2, 3), marks=pytest.mark.slow),
                                    pytest.param(Grown(5, 2, 5), marks=pytest.mark.slow)])
def test_the_draft_grows_the_reference_tree(budget):
    target = random_model(seed=3, vocab_size=24, n_layer=2, n_positions=64, std=0.3)
    draft = ModelDraft(early_exit(target, 1))
    prompt = [3, 7, 1]

    def grow(tokens):  # -> the kept tree's tokens [M+1], parents [M] and depths [M+1]
        state = start(draft, target, tokens, 3, jax.random.key(0), budget.lookahead, 4, 32)
        table = None if budget.calibration is None else jnp.float32(budget.calibration)
        tree = DynamicDraft(draft, budget._replace(calibration=None), table).propose(state, jax.random.key(1),
                                                                                    budget.lookahead, Sampling(0.8))
        return tree.tokens, tree.shape.parents, tree.shape.depth

    tokens, parents, depth = jax.jit(grow)(jnp.zeros(32, jnp.int32).at[:3].set(jnp.array(prompt)))
    law = lambda path: np.asarray(logits_to_probs(  # noqa: E731  the draft's softmax, from scratch
        picospec.logits(draft.model, jnp.array(prompt[:-1] + list(path)))[-1], Sampling()))
    expected = reference_tree(budget, prompt[-1], law)
    assert tuple(int(t) for t in tokens) == expected[0]
    assert tuple(int(j) for j in parents) == expected[1] and len(set(expected[1])) > 1  # a tree, not a chain
    depth = np.asarray(depth)
    assert all(depth[j] == depth[p] + 1 for j, p in enumerate(expected[1], 1))
    if budget.calibration is not None:  # the control: calibrated, it is another tree, and deeper
        raw = reference_tree(budget._replace(calibration=None), prompt[-1], law)
        assert raw[1] != expected[1] and depth.max() > max(reference_depths(raw[1]))


def reference_depths(parents):
    depth = [0]
    for p in parents:
        depth.append(depth[p] + 1)
    return depth


def test_the_calibration_is_how_often_the_target_takes_a_guess_of_that_probability():
    p = np.array([[0.55, 0.3, 0.1, 0.05], [0.52, 0.02, 0.06, 0.4], [0.95, 0.03, 0.01, 0.01]])
    q = np.eye(4)[[0, 3, 2]]  # T = 0: the target's argmax 0, 3 and 2
    table = calibration(p, q, W=2, bins=4)  # the 2 best guesses a position: 0.55 0.3 | 0.52 0.4 | 0.95 0.03
    # bins of c: [0, 1/4) holds 0.03 (not taken); [1/4, 1/2) 0.3 (not) and 0.4 (taken); [1/2, 3/4) 0.55
    # (taken) and 0.52 (not); [3/4, 1] 0.95 (not taken), raised to the bin before it: non-decreasing.
    assert table == pytest.approx((0.0, 0.5, 0.5, 0.5))
    assert calibration(p[:1], q[:1], W=1, bins=4) == pytest.approx((0.125, 0.375, 1.0, 1.0))  # empty bins: c


@pytest.mark.parametrize("budget, prompt", [(Grown(4, 2, 3), [3]),
                                            pytest.param(grown(8), [1, 5, 9, 2], marks=pytest.mark.slow)])
def test_greedy_is_the_targets_greedy_output(budget, prompt):
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    draft = early_exit(target, 1)
    key = jax.random.key(1)
    greedy = picospec.autoregressive_sample(target, prompt, 30, key, temperature=0)
    spec, trace = picospec.speculative_sample(draft, target, prompt, 30, key, temperature=0, tree=budget)
    np.testing.assert_array_equal(spec, greedy)
    assert int(trace.n_steps) < 30  # drafts were kept


@pytest.mark.slow
def test_the_loop_with_a_dynamic_tree_follows_the_target_joint_law():
    triples = speculative_triples(K=1, temperature=1.0, tree=Grown(3, 2, 2))
    assert chi_square_p(triples, target_law(Sampling(1.0))) > PASS
    assert chi_square_p(triples, target_law(Sampling(1.0), DRAFT)) < FAIL  # the control: the draft's law


@pytest.mark.parametrize("budget", [Grown(5, 2, 2), Grown(2, 2, 3), Grown(4, 0, 4), Grown(4, 9999, 2),
                                    Grown(4, 2, 3, (0.5, 1.5))])  # a calibration past 1
def test_a_budget_that_cannot_be_grown_is_refused(budget):
    with pytest.raises(PicospecError, match="dynamic tree"):
        picospec.speculative_sample(DRAFT, TARGET, [1, 4], 8, jax.random.key(0), tree=budget)
