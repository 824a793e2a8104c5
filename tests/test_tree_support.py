"""Where a node has more children than its draft law has tokens of nonzero probability: temperature 0,
top-k or top-p narrower than the siblings, and a temperature low enough that float32 underflows. Every
way of choosing children, and several drafts whose first tokens are chosen as a tree's children, must
still give exactly the target's law, with every token inside the vocabulary."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import early_exit, random_model
from stats import FAIL, PASS, chi_square_p
from test_several import rrs_law
from test_speculative import DRAFT, N_PATH, TARGET, V, speculative_triples, target_law
from test_tree import SHAPES, SMALL, draws, law_error, tree_law
from test_verifiers import add, markov_tables, markov_target_law, stream_law

import picospec
from picospec import PicospecError, Sampling
from picospec.beyond import tree, tree_verify
from picospec.beyond.dynamic import Grown, grown
from picospec.beyond.several import chain_nodes, match_branches, token_branches
from picospec.beyond.tree import CHILDREN, TreeProposal, branches
from picospec.beyond.tree_verify import verify_tree
from picospec.beyond.verifiers import RULES
from picospec.sampling import logits_to_probs

NARROW = {"T = 0": Sampling(0.0), "top-k 2": Sampling(1.0, 2), "top-p 0.5": Sampling(1.0, 0, 0.5),
          "T = 0.01, float32 underflow": Sampling(0.01)}
NARROW_SHAPES = [*SMALL, "2 branches, depth 2"]
SHAPES["2 branches, depth 2"] = branches(2, 2)


def narrow_tables(sampling: Sampling):
    """The Markov pair's laws standardized by the code (float32, where the low temperature underflows)."""
    def tables(seed):
        laws = (np.float64(logits_to_probs(jnp.log(jnp.float32(x)), sampling)) for x in markov_tables(seed))
        return tuple(law / law.sum(-1, keepdims=True) for law in laws)
    return tables


@pytest.mark.parametrize("setting", NARROW)
def test_every_child_rule_gives_the_targets_law_past_the_draft_laws_support(setting):
    """Exact enumeration on a 4-token vocabulary, every child rule and shape, seeds 0 and 2. The control:
    a child of g = 0 accepted wherever r has mass on it (an unguarded min(1, r/g)) is off, except at
    T = 0, where r is one-hot and such a child is the target's own token (there the code's fault was a
    token outside the vocabulary: the greedy tests below)."""
    tables = narrow_tables(NARROW[setting])
    assert np.count_nonzero(tables(0)[0], axis=1).min() < 3, "some node must have more children than tokens"
    for name, children, seed in itertools.product(NARROW_SHAPES, CHILDREN, (0, 2)):
        assert law_error(SHAPES[name], children, seed, tables=tables) < 1e-6, (name, children, seed)
    if setting != "T = 0":
        assert law_error(SHAPES["3 then 1, depth 2"], "distinct", 2, tables=tables, guarded=False) > 0.1


def test_a_node_never_draws_a_child_from_an_empty_law():
    """tree.choose, distinct children of a one-hot law: the first is its token, the others untried tokens
    of probability 0 (which the verifier never accepts), all inside the vocabulary."""
    law, tried, chosen = jnp.eye(V)[3], jnp.zeros(V, bool), []
    for rank, key in enumerate(jax.random.split(jax.random.key(0), 3)):
        token = int(tree.choose(key, law, rank, tried, "distinct"))
        chosen, tried = chosen + [token], tried.at[token].set(True)
    assert chosen[0] == 3 and len(set(chosen)) == 3 and max(chosen) < V, chosen


@pytest.mark.parametrize("setting, name, seed, x", [("T = 0", "uneven, depth 3", 1, 3),
                                                    ("top-k 2", "3 then 1, depth 2", 1, 2)])
def test_the_rule_as_coded_never_accepts_a_child_past_the_support(setting, name, seed, x):
    """verify_tree on a tree with a distinct child past its parent's support (the one, after x, where
    accepting that child would change the law the most), sampled 20 000 times, against the law
    enumerated above; the control: the law where that child is accepted is rejected."""
    shape, (P, Q) = SHAPES[name], narrow_tables(NARROW[setting])(seed)
    def differ(tokens):  # how far the law with such a child accepted is from the right one
        right, wrong = (tree_law(shape, "distinct", tokens, P, Q, guarded) for guarded in (True, False))
        return max(abs(right.get(block, 0.0) - wrong.get(block, 0.0)) for block in right.keys() | wrong.keys())
    tokens = max((t for t, _ in draws(shape, "distinct", x, P)), key=differ)  # the sharpest such tree
    assert differ(tokens) > 0.5
    laws = np.stack([P[t] for t in tokens]) * shape.expanded[:, None]  # [M+1, V]
    proposal = TreeProposal(jnp.array(tokens, jnp.int32), jnp.float32(laws), None)
    once = jax.vmap(lambda k1, k2: (lambda path, verdict: (path, verdict.n_accepted, verdict.extra))(
        *verify_tree(k1, k2, shape, "distinct", proposal, jnp.float32(np.stack([Q[t] for t in tokens])))))
    path, a, extra = once(jax.random.split(jax.random.key(0), 20_000), jax.random.split(jax.random.key(1), 20_000))
    blocks = [tuple(tokens[j] for j in np.asarray(row)[1:1 + int(m)]) + (int(y),) for row, m, y in zip(path, a, extra)]
    assert fits(blocks, tree_law(shape, "distinct", tokens, P, Q)) > PASS
    assert fits(blocks, tree_law(shape, "distinct", tokens, P, Q, guarded=False)) < FAIL


def p_value(samples, probs) -> float:
    """chi_square_p, or 0 where a sample of probability 0 occurred (for the controls)."""
    if np.asarray(probs)[samples].min() == 0:
        return 0.0
    return chi_square_p(samples, probs)


def fits(blocks, law) -> float:
    """Chi-square p of the sampled blocks against a law of blocks; 0 where one the law never gives occurs."""
    cells = {block: i for i, block in enumerate(b for b, p in law.items() if p > 0)}
    if any(block not in cells for block in blocks):
        return 0.0
    if len(cells) == 1:  # one block of probability 1 (T = 0), and every sample is it
        return 1.0
    return chi_square_p(np.array([cells[block] for block in blocks]), [p for p in law.values() if p > 0])


def unguarded_choose(key, law, rank, tried, children):
    """The control: a distinct child drawn from the untried law even when it is all zero (it returns V)."""
    if children == "distinct":
        return picospec.sampling.sample(key, jnp.where(tried, 0.0, law))
    return ORIGINAL_CHOOSE(key, law, rank, tried, children)


def unguarded_acceptance(r, g, token):
    """The control: r(c) / g(c) even where g(c) = 0 (inf: accepted wherever r has mass)."""
    return r[token] / g[token]


ORIGINAL_CHOOSE = tree.choose
GREEDY_CASES = [dict(temperature=0), dict(temperature=1.0, top_k=1), dict(temperature=1.0, top_p=0.3)]


def greedy_mismatches(cases, shapes, children=CHILDREN):
    """The (case, shape, children) whose output differs from the target's greedy output. The target (5
    tokens) writes its last token often, where an out-of-range token's clamped read r[V - 1] lands."""
    target = random_model(seed=20, vocab_size=5, n_layer=2, n_positions=128, std=0.5)
    draft, prompt, key = early_exit(target, 1), [1, 2], jax.random.key(1)
    greedy = np.asarray(picospec.autoregressive_sample(target, prompt, 40, key, temperature=0))
    missed = []
    for case, name, how in itertools.product(cases, shapes, children):
        out, _ = picospec.speculative_sample(draft, target, prompt, 40, key, tree=SHAPES[name], children=how, **case)
        if not (np.asarray(out) == greedy).all():
            missed.append((case, name, how))
    return missed


def test_greedy_identity_with_distinct_children_past_the_support():
    """T = 0: every node's law is one-hot, so every second child is past it."""
    assert greedy_mismatches(GREEDY_CASES[:1], ["3 then 1, depth 2"], ["distinct"]) == []


@pytest.mark.slow
@pytest.mark.parametrize("case", GREEDY_CASES)
def test_greedy_identity_for_every_shape_with_more_siblings_than_tokens(case):
    """T = 0 (one-hot laws) or a top-k / top-p that keeps one token: every shape, every child rule."""
    assert greedy_mismatches([case], SHAPES) == []


def test_control_children_drawn_from_an_empty_law_break_greedy_identity(monkeypatch):
    monkeypatch.setattr(tree, "choose", unguarded_choose)
    monkeypatch.setattr(tree_verify, "acceptance", unguarded_acceptance)
    jax.clear_caches()
    try:
        assert greedy_mismatches(GREEDY_CASES[:1], SMALL[:1], ["distinct"])
    finally:
        monkeypatch.undo()
        jax.clear_caches()


def test_the_loop_with_distinct_children_follows_the_target_law_under_top_k():
    """picospec.speculative_sample, 3 distinct children at the root under top-k 2: the first three tokens
    against the target's law; the control: the draft's."""
    triples = speculative_triples(K=1, n=N_PATH, temperature=1.0, top_k=2, tree=SHAPES["3 then 1, depth 2"],
                                  children="distinct")
    assert triples.max() < V ** 3
    assert chi_square_p(triples, target_law(Sampling(1.0, 2))) > PASS
    assert p_value(triples, target_law(Sampling(1.0, 2), DRAFT)) < FAIL


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["top-p 0.5", "T = 0.01, float32 underflow"])
def test_the_loop_with_distinct_children_follows_the_target_law_when_narrow(setting):
    sampling = NARROW[setting]
    triples = speculative_triples(K=1, n=N_PATH, temperature=sampling.temperature, top_p=sampling.top_p,
                                  tree=SHAPES["3 then 1, depth 2"], children="distinct")
    assert triples.max() < V ** 3
    law = target_law(sampling)
    if np.count_nonzero(law) == 1:  # the target's law is one sequence here: every run must give it
        assert (triples == np.argmax(law)).all()
    else:
        assert chi_square_p(triples, law) > PASS


# ---- several drafts whose first tokens are chosen as a tree's children ----

def several_error(children, seed, rule=None):
    """Two chains of 2 whose first drafts are chosen as `children` says, each then drawn from p (the
    code's TreeDraft on branches), verified by the tree's rule, or by `rule` (a test_several law)."""
    shape, nodes = branches(2, 2), chain_nodes(branches(2, 2))
    P, Q = markov_tables(seed)

    def iteration(_, x, K, P, Q):
        law = {}
        for tokens, prob in draws(shape, children, x, P):
            block_law = (tree_law(shape, children, tokens, P, Q) if rule is None else
                         rule([tuple(tokens[j] for j in row[1:]) for row in nodes], x, P, Q))
            for block, p_block in block_law.items():
                add(law, block, prob * p_block)
        return law
    law, target = stream_law(None, 0, 3, None, P, Q, {}, iteration), markov_target_law(0, 3, Q)
    return max(abs(law.get(s, 0.0) - target[s]) for s in target)


@pytest.mark.parametrize("children", ["top", "distinct"])
def test_several_drafts_with_chosen_first_tokens_are_exact_by_the_trees_rule(children):
    """Enumerated: the tree's rule is exact for them; the control, recursive rejection sampling (the
    several-drafts rule, which assumes independent draws from p) is off for them."""
    for seed in (0, 1):
        assert several_error(children, seed) < 1e-6
    assert several_error(children, 0, rule=rrs_law) > 1e-3
    assert several_error("iid", 0, rule=rrs_law) < 1e-6  # iid first drafts: the several-drafts rule is exact


def test_several_drafts_take_the_rule_their_children_need():
    from picospec.tools.samplers import plug_in
    rules = {(verify, children): plug_in(DRAFT, TARGET, 4, verify, 2, tree=branches(2, 2), children=children)[2]
             for verify in ("token", "match") for children in CHILDREN}
    assert rules[("token", "iid")] is token_branches
    assert rules[("token", "top")] is rules[("token", "distinct")] is verify_tree
    assert all(rules[("match", children)] is match_branches for children in CHILDREN)  # match reads no p


@pytest.mark.slow  # the fast suite: the enumeration above, the rule chosen, and the CLI's greedy run
@pytest.mark.parametrize("children", ["top", "distinct"])
def test_the_loop_with_several_drafts_and_chosen_children_follows_the_target_law(children):
    triples = speculative_triples(K=2, n=N_PATH, temperature=1.0, drafts=2, children=children)
    assert chi_square_p(triples, target_law(Sampling(1.0))) > PASS
    assert chi_square_p(triples, target_law(Sampling(1.0), DRAFT)) < FAIL


@pytest.mark.parametrize("shape", [["--drafts", "2", "--children", "top"], ["--tree", "4", "--children", "distinct"],
                                   pytest.param(["--drafts", "2", "--children", "distinct"], marks=pytest.mark.slow)])
def test_the_cli_runs_chosen_children_greedy_identical(capsys, shape):
    """At T = 0 every node's law is one-hot: a tree's distinct siblings are past it, and several drafts'
    first tokens other than the draft's top one too."""
    from test_cli import PAIR, run_cli
    code, out, err = run_cli(capsys, *PAIR, "--prompt", "The quick", "--n-tokens", "12", "--K", "2", *shape,
                             "--mode", "compare", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["identical"] and all(token < 300 for token in report["speculative"]["tokens"])  # tiny-hub: V = 300


def test_the_cli_refuses_children_with_nothing_to_choose(capsys):
    from test_cli import PAIR, run_cli
    for argv, says in ((["--children", "top"], "--tree M or --drafts N"), (["--drafts", "2", "--children", "dynamic"],
                                                                         "needs --tree")):
        code, _, err = run_cli(capsys, *PAIR, "--prompt", "The", *argv)
        assert code == 2 and err.count("\n") == 1 and says in err, err


def refused(tree_, children: str, verify: str, drafts: int) -> bool:
    """The combinations the README's options table does not offer."""
    if tree_ is not None:
        return verify != "token" or drafts != 1 or (children == "dynamic" and not isinstance(tree_, Grown))
    return (drafts > 1 and verify == "block") or (children != "iid" and (drafts == 1 or children == "dynamic"))


@pytest.mark.slow
def test_every_combination_of_drafts_tree_children_and_verify_is_exact_or_refused():
    """Through the public API at T = 0, on the target whose greedy text often lands on its last token:
    each combination gives the target's greedy output, or, where the table does not offer it, a one-line
    PicospecError (the CLI prints it and exits with 2)."""
    target = random_model(seed=20, vocab_size=5, n_layer=2, n_positions=128, std=0.5)
    draft, prompt, key = early_exit(target, 1), [1, 2], jax.random.key(1)
    greedy = np.asarray(picospec.autoregressive_sample(target, prompt, 30, key, temperature=0))
    for tree_, children, verify, drafts in itertools.product((None, SHAPES["3 then 1, depth 2"], grown(4, 2)),
                                                             (*CHILDREN, "dynamic"), RULES, (1, 2)):
        case = (tree_, children, verify, drafts)
        try:
            out, _ = picospec.speculative_sample(draft, target, prompt, 30, key, K=2, temperature=0, tree=tree_,
                                                 children=children, verify=verify, drafts=drafts)
        except PicospecError as e:
            assert refused(*case) and "\n" not in str(e), case
            continue
        assert not refused(*case), case
        np.testing.assert_array_equal(out, greedy, err_msg=str(case))
