"""Token trees: the law of the tokens out of a tree, for each way of choosing children, enumerated
exactly on a 4-token Markov pair (with a control that verifies children as drawn the wrong way), the
rule as coded sampled against that law, and greedy identity through the real loop."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import DATA, early_exit, random_model
from stats import FAIL, PASS, chi_square_p
from test_speculative import DRAFT, N_PATH, TARGET, speculative_triples, target_law
from test_verifiers import V, add, markov_tables, markov_target_law, stream_law

import picospec
from picospec import PicospecError, Sampling
from picospec.beyond import loop, theory, tree_theory
from picospec.beyond.dynamic import grown
from picospec.beyond.loop import ModelDraft
from picospec.beyond.tree import CHILDREN, Shape, TreeDraft, TreeProposal, branches, chain
from picospec.beyond.tree_verify import tree_step, verify_tree

SHAPES = {"binary, depth 2": Shape((0, 0, 1, 1, 2, 2)), "3 from the root, depth 2": Shape((0, 0, 0, 1, 2, 3)),
          "2 branches, depth 3": branches(2, 3), "uneven, depth 3": Shape((0, 0, 1, 1, 3)),
          "3 then 1, depth 2": Shape((0, 0, 0, 1))}
SMALL = ("uneven, depth 3", "3 then 1, depth 2")  # the fast suite's; `pytest -m slow` enumerates all


def kids(shape, j):
    return [c for c in range(1, shape.M + 1) if shape.parents[c - 1] == j]


def trial_law(children, p, t, tried):  # the law child t was drawn from, as the verifier must see it
    if children == "top":
        return np.eye(V)[t]
    if children == "distinct":  # all zero once p's support is spent: that child was not drawn
        untried = np.where(np.isin(np.arange(V), list(tried)), 0.0, p)
        return untried / untried.sum() if untried.sum() > 0 else untried
    return p


def tree_law(shape, children, tokens, P, Q, guarded=True):
    """The law of one iteration's output block (the accepted path's drafts, then one token) given the
    tree's tokens (node 0 is the last token x), written out: at each node the children in turn against
    the residual r, as tree.py's docstring says. guarded=False, the control: a child of g = 0 is
    accepted wherever r has mass on it (r / 0 = inf), as an unguarded min(1, r/g) does."""
    law = {}

    def walk(j, prefix, prob):
        r, p, tried = Q[tokens[j]].copy(), P[tokens[j]], set()
        for c in kids(shape, j):
            t = tokens[c]
            g = trial_law(children, p, t, tried)
            accept = min(1.0, r[t] / g[t]) if g[t] > 0 else float(not guarded and r[t] > 0)
            if accept > 0:
                walk(c, prefix + (t,), prob * accept)
            prob *= 1 - accept
            residual = np.maximum(r - g, 0)
            if residual.sum() > 0:
                r = residual / residual.sum()
            tried.add(t)
        for y in range(V):
            add(law, prefix + (y,), prob * r[y])
    walk(0, (), 1.0)
    return law


def draws(shape, children, x, P):
    """Every tree the draft can grow after x, with its probability: children drawn independently from
    P[parent], the top ones of P[parent], or drawn from it without replacement (once its support is
    spent, the first token not yet tried, as tree.choose proposes)."""
    for flat in itertools.product(range(V), repeat=shape.M):
        tokens, prob = (x,) + flat, 1.0
        for j in range(shape.M + 1):
            p, tried = P[tokens[j]], []
            for rank, c in enumerate(kids(shape, j)):
                t = tokens[c]
                if children == "iid":
                    prob *= p[t]
                elif children == "top":
                    prob *= float(t == np.argsort(-p, kind="stable")[rank])
                else:
                    untried = [y for y in range(V) if y not in tried]
                    mass = p[untried].sum()
                    prob *= (0.0 if t in tried else p[t] / mass) if mass > 0 else float(t == untried[0])
                tried.append(t)
        if prob > 0:
            yield tokens, prob


def tree_iteration(shape, children, verified_as=None, guarded=True):
    def iteration(rule, x, K, P, Q):
        law = {}
        for tokens, prob in draws(shape, children, x, P):
            for block, p_block in tree_law(shape, verified_as or children, tokens, P, Q, guarded).items():
                add(law, block, prob * p_block)
        return law
    return iteration


def law_error(shape, children, seed, verified_as=None, L=3, tables=markov_tables, guarded=True):
    P, Q = tables(seed)
    law = stream_law(None, 0, L, None, P, Q, {}, tree_iteration(shape, children, verified_as, guarded))
    target = markov_target_law(0, L, Q)
    return max(abs(law.get(s, 0.0) - target[s]) for s in target)


@pytest.mark.parametrize("name", [name if name in SMALL else pytest.param(name, marks=pytest.mark.slow)
                                  for name in SHAPES])
def test_every_way_of_choosing_children_gives_the_targets_law_exactly(name):
    for children in CHILDREN:
        for seed in (0, 1) if name in SMALL else (0, 1, 2):
            assert law_error(SHAPES[name], children, seed) < 1e-6, (children, seed)


def test_control_children_verified_as_drawn_another_way_are_off():
    shape = SHAPES["uneven, depth 3"]
    assert law_error(shape, "top", 0, verified_as="iid") > 1e-3  # deterministic children taken for draws
    assert law_error(shape, "distinct", 0, verified_as="iid") > 1e-3  # without replacement taken for with


def tokens_per_call(shape, children, seed):
    P, Q = markov_tables(seed)
    return sum(prob * len(block) for block, prob in tree_iteration(shape, children)(None, 0, None, P, Q).items())


def test_a_tree_keeps_at_least_what_its_longest_chain_keeps():
    for seed in (0, 1, 2):
        one = tokens_per_call(chain(2), "iid", seed)
        assert tokens_per_call(SHAPES["3 then 1, depth 2"], "iid", seed) >= one - 1e-12


@pytest.mark.parametrize("children", CHILDREN)
def test_the_rule_as_coded_draws_its_exact_law(children):
    """verify_tree on fixed trees, sampled 20 000 times, against tree_law (chi-square)."""
    shape, (P, Q) = SHAPES["uneven, depth 3"], markov_tables(1)
    trees = [tokens for tokens, _ in draws(shape, children, 3, P)]
    tokens = trees[len(trees) // 3]
    laws = np.stack([P[t] for t in tokens]) * shape.expanded[:, None]  # [M+1, V]
    q = np.stack([Q[t] for t in tokens])  # [M+1, V]
    tree = TreeProposal(jnp.array(tokens, jnp.int32), jnp.float32(laws), None)

    def once(k1, k2):
        path, verdict = verify_tree(k1, k2, shape, children, tree, jnp.float32(q))
        return path, verdict.n_accepted, verdict.extra
    n = 20_000
    path, a, extra = jax.vmap(once)(jax.random.split(jax.random.key(0), n), jax.random.split(jax.random.key(1), n))
    expected = tree_law(shape, children, tokens, P, Q)
    cells = {block: i for i, block in enumerate(expected)}
    index = np.array([cells[tuple(tokens[j] for j in np.asarray(row)[1:1 + int(m)]) + (int(y),)]
                      for row, m, y in zip(path, a, extra)])
    assert chi_square_p(index, np.array(list(expected.values()))) > PASS


def test_greedy_is_the_targets_greedy_output_on_transformers_written_checkpoints():
    """A checkpoint transformers wrote (tests/make_reference_data.py), drafted for by its own first layer:
    a tree and several drafts (the tree of their branches) give the target's greedy output."""
    target = picospec.load_model(str(DATA / "tiny-hub"))
    draft = early_exit(target, 1)
    prompt, key = [5, 17, 3], jax.random.key(0)
    greedy = picospec.autoregressive_sample(target, prompt, 24, key, temperature=0)
    for kw in (dict(tree=Shape((0, 0, 1, 2, 3))), dict(K=2, drafts=3)):
        spec, trace = picospec.speculative_sample(draft, target, prompt, 24, key, temperature=0, **kw)
        np.testing.assert_array_equal(spec, greedy, err_msg=str(kw))
        kept = np.asarray(trace.n_accepted[:int(trace.n_steps)])
        assert kept.min() < kept.max(), kept  # paths of different depths: drafts kept, and rejected


@pytest.mark.slow  # the fast suite checks one tree on a transformers-written checkpoint (above)
@pytest.mark.parametrize("children", CHILDREN)
def test_greedy_is_the_targets_greedy_output_for_trees(children):
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    draft = ModelDraft(early_exit(target, 1))
    key = jax.random.key(1)
    for shape, prompt in ((SHAPES["binary, depth 2"], [3]), (branches(3, 2), [1, 5, 9, 2])):
        greedy = picospec.autoregressive_sample(target, prompt, 30, key, temperature=0)
        spec, _ = loop.speculative_sample(TreeDraft(draft, shape, children), target, prompt, 30, key,
                                                 K=shape.M, temperature=0, step=tree_step, verify=verify_tree)
        np.testing.assert_array_equal(spec, greedy, err_msg=f"{shape}, {children}")


def test_the_measured_rank_law_is_the_enumerated_acceptance_of_each_child():
    """tree_theory.rank_law: the chance the i-th child of a node is the one accepted, over every way the
    children can be drawn, equals the enumeration for 3 children of one node (distinct: sampled orders,
    to 0.01). The control: the constant-alpha law overstates iid side children."""
    star, (P, Q) = Shape((0, 0, 0)), markov_tables(2)
    for children, tolerance in (("iid", 1e-12), ("top", 1e-12), ("distinct", 1e-2)):
        law = tree_theory.rank_law(children, P[0], Q[0], 3, draws=4000)
        assert abs(1 + law.sum() - tokens_per_call(star, children, 2)) < tolerance, children
    alpha = theory.alpha_exact(P[0], Q[0])
    assert tree_theory.rank_law("iid", P[0], Q[0], 3)[1] < tree_theory.rank_acceptance(alpha, 3)[1] - 0.05
    one_hot = np.eye(4)[[1]]  # T = 0: p has one token, so no second distinct child can be drawn, or accepted
    law = tree_theory.rank_law("distinct", one_hot, Q[:1], 3)
    assert law[0] == pytest.approx(Q[0, 1]) and not law[1:].any()


def test_theorys_tokens_per_call_of_a_tree_is_the_enumerated_one():
    """tree_theory.tree_tokens_per_call with each node's edge from tree_theory.child_acceptance equals the mean
    length of the enumerated output block, for fixed trees of each kind of children."""
    shape, (P, Q) = SHAPES["uneven, depth 3"], markov_tables(2)
    for children in CHILDREN:
        tokens, _ = next(draws(shape, children, 1, P))
        edges = np.zeros(shape.M)
        for j in range(shape.M + 1):
            below = kids(shape, j)
            edges[np.array(below, int) - 1] = tree_theory.child_acceptance(children, P[tokens[j]], Q[tokens[j]],
                                                                      [tokens[c] for c in below])
        enumerated = sum(prob * len(block) for block, prob in tree_law(shape, children, tokens, P, Q).items())
        assert abs(tree_theory.tree_tokens_per_call(shape.parents, edges) - enumerated) < 1e-12, children


def all_trees(M):
    """Every tree of M drafted nodes (as parents lists where each node's parent comes before it)."""
    if M == 0:
        yield ()
        return
    for smaller in all_trees(M - 1):
        for parent in range(M):
            yield smaller + (parent,)


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.9])
def test_the_optimal_tree_is_the_best_of_every_tree_searched_by_hand(alpha):
    p = tree_theory.rank_acceptance(alpha, 5)
    for M in range(1, 6):
        best = max(tree_theory.tree_tokens_per_call(t, tree_theory.rank_edges(t, p)) for t in all_trees(M))
        found = tree_theory.optimal_tree(M, p)
        assert len(found) == M and all(parent < j for j, parent in enumerate(found, 1))
        assert abs(tree_theory.tree_tokens_per_call(found, tree_theory.rank_edges(found, p)) - best) < 1e-12, (alpha, M)
    # A chain is the best tree when one guess is almost always right, and its count is the paper's.
    chain_tokens = tree_theory.tree_tokens_per_call(chain(4).parents, tree_theory.rank_edges(chain(4).parents, p))
    assert abs(chain_tokens - theory.expected_tokens_per_call(alpha, 4)) < 1e-12
    # The control: a chain is not optimal at a low alpha and a large budget.
    wide = tree_theory.optimal_tree(8, tree_theory.rank_acceptance(0.3, 8))
    assert wide != chain(8).parents


@pytest.mark.parametrize("children", ["iid", pytest.param("top", marks=pytest.mark.slow),
                                      pytest.param("distinct", marks=pytest.mark.slow)])
def test_the_loop_with_a_tree_follows_the_target_joint_law(children):
    """The first three tokens of the real loop (picospec.speculative_sample with a tree), sampled."""
    triples = speculative_triples(K=1, n=N_PATH, temperature=1.0, tree=SHAPES["3 then 1, depth 2"],
                                  children=children)
    assert chi_square_p(triples, target_law(Sampling(1.0))) > PASS
    assert chi_square_p(triples, target_law(Sampling(1.0), DRAFT)) < FAIL  # the control: the draft's law


@pytest.mark.parametrize("kw, says", [(dict(tree=(0, 1)), "Shape"), (dict(children="best"), "children"),
                                      (dict(verify="block"), "own rule"), (dict(drafts=2), "own rule"),
                                      (dict(draft="ngram"), "draft model")])
def test_what_a_tree_cannot_do_is_refused(kw, says):
    target = random_model(vocab_size=8)
    draft = picospec.NGramDraft(2) if kw.pop("draft", None) else early_exit(target, 1)
    kw = {"tree": chain(2), **kw}
    with pytest.raises(PicospecError, match=says):
        picospec.speculative_sample(draft, target, [1, 4], 8, jax.random.key(0), **kw)


def test_the_cli_runs_a_tree_greedy_identical_and_reports_it(capsys):
    from test_cli import PAIR, run_cli
    code, out, err = run_cli(capsys, *PAIR, "--prompt", "The quick", "--n-tokens", "10", "--tree", "5",
                             "--mode", "compare", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["identical"] and report["speculative"]["stats"]["tree"]["nodes"] == 5
    assert all(step["k"] <= 5 and step["accepted"] <= step["k"] for step in report["speculative"]["steps"])
    code, _, err = run_cli(capsys, *PAIR, "--prompt", "The", "--tree", "4", "--verify", "block")
    assert code == 2 and err.count("\n") == 1 and "own rule" in err


def test_the_clis_tree_shape_comes_from_the_acceptance_measured_on_the_prompts():
    from argparse import Namespace

    from picospec.tools.cli.options import TREE_ALPHA, tree_shape
    target, unrelated = random_model(seed=3, vocab_size=16, n_layer=2), random_model(seed=9, vocab_size=16, n_layer=2)
    args, prompts = Namespace(tree=8, children="iid"), [[1, 5, 9, 2, 7, 3]]
    assert tree_shape(args, target, target, prompts, Sampling(1.0)) == chain(8)  # alpha = 1: a chain is best
    bushy = tree_shape(args, unrelated, target, prompts, Sampling(1.0))  # a draft that is often wrong
    assert bushy.M == 8 and max(bushy.parents.count(j) for j in bushy.parents) > 1
    fallback = tree_shape(args, unrelated, target, [[1, 5]], Sampling(1.0))  # too few positions to measure
    assert fallback == Shape(tree_theory.optimal_tree(8, tree_theory.rank_acceptance(TREE_ALPHA, 8)))
    dynamic, greedy = Namespace(tree=8, children="dynamic"), Sampling(0.0)  # grown as deep as theory's tree
    budget = tree_shape(dynamic, target, target, prompts, greedy)  # alpha = 1: the best tree is a chain
    assert budget[:3] == grown(8, 8)[:3] and budget.calibration is not None  # ... and its confidence calibrated
    p, q = (np.asarray(picospec.sampling.logits_to_probs(picospec.logits(m, prompts[0]), how))
            for m, how in ((unrelated, Sampling()), (target, greedy)))
    law = tree_theory.rank_law("top", p, q, 8)
    deep = Shape(tree_theory.optimal_tree(8, law)).D
    assert tree_shape(dynamic, unrelated, target, prompts, greedy)[:3] == grown(8, deep)[:3] and deep < 8


@pytest.mark.slow
def test_batch_rows_with_a_tree_are_single_calls():
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    draft, shape = early_exit(target, 1), SHAPES["uneven, depth 3"]
    prompts, keys = [[1, 4], [2, 0, 3, 5, 6]], jax.random.split(jax.random.key(5), 2)
    out, _ = picospec.speculative_sample_batch(draft, target, prompts, 12, keys, temperature=1.0, tree=shape)
    for b, prompt in enumerate(prompts):
        single, _ = picospec.speculative_sample(draft, target, prompt, 12, keys[b], temperature=1.0, tree=shape)
        np.testing.assert_array_equal(out[b], single)


def test_the_trace_shows_the_accepted_path_then_the_rejected_child():
    """For a chain-shaped tree, the token after the accepted drafts is the rejected child, which the
    residual never draws again (r(d) < p(d) made it rejected), and a full path ends in a bonus."""
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    _, trace = picospec.speculative_sample(early_exit(target, 1), target, [1, 2], 40, jax.random.key(3),
                                           temperature=1.0, tree=chain(3))
    n = int(trace.n_steps)
    drafted, a, extra, k = (np.asarray(x[:n]) for x in (trace.drafted, trace.n_accepted, trace.extra, trace.k))
    rejected = a < k
    assert rejected.any() and (~rejected).any()
    assert (drafted[rejected, a[rejected]] != extra[rejected]).all()


def test_a_chain_shaped_tree_runs_as_a_chain():
    """Theory's tree is often the chain itself: it then runs on speculative.py's step (the same law, less
    machinery), unless its children are the draft's top tokens rather than draws from p."""
    from picospec.beyond.loop import speculative_step
    from picospec.speculative import accept_or_resample
    from picospec.tools.samplers import plug_in
    _, step, verify = plug_in(DRAFT, TARGET, 3, tree=chain(3))
    assert step is speculative_step and verify is accept_or_resample
    assert plug_in(DRAFT, TARGET, 3, tree=chain(3), children="distinct")[1] is speculative_step  # one child: a draw
    assert plug_in(DRAFT, TARGET, 3, tree=chain(3), children="top")[1] is tree_step
    assert plug_in(DRAFT, TARGET, 3, tree=Shape((0, 0, 1)))[1:] == (tree_step, verify_tree)
