"""Several drafts: N independent chains verified in one call by recursive rejection sampling (or the
match rule) give exactly the target's law, by enumeration on a 4-token vocabulary and by sampling."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import early_exit, random_model
from stats import FAIL, PASS, chi_square_p
from test_speculative import DRAFT, TARGET, speculative_triples, target_law
from test_verifiers import V, add, markov_tables, markov_target_law, stream_law

import picospec
from picospec import PicospecError, Sampling
from picospec.beyond import loop
from picospec.beyond.several import CHAINS
from picospec.beyond.verifiers import RULES


def rrs_law(chains, x, P, Q, reuse_q=False):
    """The law of one iteration's output block given the drafted chains (tuples of K tokens after x),
    by recursive rejection sampling written out: at each depth the alive chains in turn against the
    residual r. reuse_q: the control that tries every candidate against q itself."""
    law, K = {}, len(chains[0])

    def depth(i, alive, prefix, prob):
        p, q = P[((x,) + prefix)[-1]], Q[((x,) + prefix)[-1]]
        if i == K:
            for y in range(V):
                add(law, prefix + (y,), prob * q[y])
            return
        r = q.copy()
        for j in alive:
            t = chains[j][i]
            accept = min(1.0, r[t] / p[t])
            if accept > 0:
                depth(i + 1, [c for c in alive if chains[c][i] == t], prefix + (t,), prob * accept)
            prob *= 1 - accept
            residual = np.maximum(r - p, 0)
            if not reuse_q and residual.sum() > 0:
                r = residual / residual.sum()
        for y in range(V):
            add(law, prefix + (y,), prob * r[y])
    depth(0, list(range(len(chains))), (), 1.0)
    return law


def match_several_law(chains, x, P, Q):
    """The target samples t_i ~ q; the alive chains that drafted t_i go on."""
    law, K = {}, len(chains[0])

    def depth(i, alive, prefix, prob):
        q = Q[((x,) + prefix)[-1]]
        for t in range(V):
            going = [c for c in alive if i < K and chains[c][i] == t]
            if going:
                depth(i + 1, going, prefix + (t,), prob * q[t])
            else:
                add(law, prefix + (t,), prob * q[t])
    depth(0, list(range(len(chains))), (), 1.0)
    return law


def several_iteration(N, **kw):
    def iteration(rule, x, K, P, Q):
        """Every draw of N independent chains of K drafts after x, times the rule's law given them."""
        law = {}
        for flat in itertools.product(range(V), repeat=N * K):
            chains = [flat[j * K:(j + 1) * K] for j in range(N)]
            chance = np.prod([P[((x,) + c)[i]][c[i]] for c in chains for i in range(K)])
            for block, prob in rule(chains, x, P, Q, **kw).items():
                add(law, block, chance * prob)
        return law
    return iteration


def error(rule, N, seed, **kw):
    P, Q = markov_tables(seed)
    law, target = stream_law(rule, 0, 3, 2, P, Q, {}, several_iteration(N, **kw)), markov_target_law(0, 3, Q)
    return max(abs(law.get(s, 0.0) - target[s]) for s in target)


def kept(rule, N, seed):
    P, Q = markov_tables(seed)
    return sum(prob * len(block) for block, prob in several_iteration(N)(rule, 0, 2, P, Q).items())


@pytest.mark.parametrize("N, seed", [(2, 0), pytest.param(3, 0, marks=pytest.mark.slow),
                                     pytest.param(2, 1, marks=pytest.mark.slow)])
def test_several_drafts_give_the_targets_law_exactly_and_more_drafts_keep_more(N, seed):
    for rule in (rrs_law, match_several_law):
        assert error(rule, N, seed) < 1e-6, rule.__name__
        assert kept(rule, N - 1, seed) <= kept(rule, N, seed) + 1e-9
    assert kept(match_several_law, N, seed) <= kept(rrs_law, N, seed)
    # The control: trying every candidate against q, never the residual, is not lossless.
    assert error(rrs_law, 2, 0, reuse_q=True) > 1e-3


def test_the_rule_needs_independent_chains():
    """N copies of one chain are not N draws from p: the law comes out wrong (several.py's docstring),
    so nobody should deduplicate or copy chains before verifying them."""
    def copies(rule, x, K, P, Q):  # every draw of one chain, verified as if N = 2 had been drawn
        law = {}
        for chain in itertools.product(range(V), repeat=K):
            chance = np.prod([P[((x,) + chain)[i]][chain[i]] for i in range(K)])
            for block, prob in rule([chain, chain], x, P, Q).items():
                add(law, block, chance * prob)
        return law
    for seed in (1, 2):  # errors of 0.05 and 0.04, where the independent chains' are below 1e-6
        P, Q = markov_tables(seed)
        law, target = stream_law(rrs_law, 0, 3, 2, P, Q, {}, copies), markov_target_law(0, 3, Q)
        assert max(abs(law.get(s, 0.0) - target[s]) for s in target) > 1e-2, seed


@pytest.mark.parametrize("rule, law", [("token", rrs_law), ("match", match_several_law)])
def test_each_rule_as_coded_draws_its_exact_law(rule, law):
    """The real function, for two fixed chains that share their first draft: (chain's accepted
    drafts, extra token) sampled against the law written out above."""
    P, Q = markov_tables(1)
    chains, x = [(2, 0), (2, 3), (1, 1)], 3
    p = np.stack([np.stack([P[((x,) + c)[i]] for i in range(2)]) for c in chains])  # [N, K, V]
    q = np.stack([np.stack([Q[((x,) + c)[i]] for i in range(3)]) for c in chains])  # [N, K+1, V]
    rule = CHAINS[RULES[rule]]  # the N-chain form of the rule of that name
    run = jax.vmap(lambda k1, k2: (lambda j, verdict: (j, *verdict[:2]))(*rule(k1, k2, jnp.array(chains),
                                                                             jnp.float32(p), jnp.float32(q))))
    j, a, extra = run(jax.random.split(jax.random.key(0), 20_000), jax.random.split(jax.random.key(1), 20_000))
    expected = law(chains, x, P, Q)
    cells = {block: i for i, block in enumerate(expected)}
    index = np.array([cells[chains[int(c)][:int(n)] + (int(y),)] for c, n, y in zip(j, a, extra)])
    assert chi_square_p(index, np.array(list(expected.values()))) > PASS


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["token", "match"])
def test_the_whole_loop_with_several_drafts_follows_the_target_joint_law(rule):
    triples = speculative_triples(K=2, temperature=1.0, verify=rule, drafts=2)
    assert chi_square_p(triples, target_law(Sampling(1.0))) > PASS
    assert chi_square_p(triples, target_law(Sampling(1.0), DRAFT)) < FAIL


@pytest.mark.parametrize("rule", ["token", pytest.param("match", marks=pytest.mark.slow)])
def test_greedy_is_the_targets_greedy_output(rule):
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    draft = early_exit(target, 1)
    key = jax.random.key(1)
    spec, _ = picospec.speculative_sample(draft, target, [1, 5, 9], 30, key, K=3, temperature=0, verify=rule, drafts=2)
    np.testing.assert_array_equal(spec, picospec.autoregressive_sample(target, [1, 5, 9], 30, key, temperature=0))


@pytest.mark.slow
def test_batch_rows_are_single_calls():
    prompts, keys = [[1, 4], [2, 0, 3]], jax.random.split(jax.random.key(5), 2)
    out, _ = picospec.speculative_sample_batch(DRAFT, TARGET, prompts, 10, keys, K=2, drafts=2)
    for b, prompt in enumerate(prompts):
        single, _ = picospec.speculative_sample(DRAFT, TARGET, prompt, 10, keys[b], K=2, drafts=2)
        np.testing.assert_array_equal(out[b], single)


@pytest.mark.parametrize("kw", [dict(verify="block", drafts=2), dict(drafts=0), dict(drafts=2, draft="ngram")])
def test_what_several_drafts_cannot_do_is_refused(kw):
    draft = picospec.NGramDraft(2) if kw.pop("draft", None) else DRAFT
    with pytest.raises(PicospecError, match="drafts"):
        picospec.speculative_sample(draft, TARGET, [1, 4], 8, jax.random.key(0), K=2, **kw)


def test_theorys_alpha_for_several_drafts_is_the_enumerated_acceptance():
    from picospec.beyond import theory
    P, Q = markov_tables(2)
    for N in (1, 2, 3):
        law = several_iteration(N)(rrs_law, 1, 1, P, Q)  # K = 1 after token 1: kept is 0 or 1
        accepted = sum(prob for block, prob in law.items() if len(block) == 2)
        assert abs(theory.alpha_several(P[1], Q[1], N) - accepted) < 1e-9
    assert abs(theory.alpha_several(P[1], Q[1], 1) - theory.alpha_exact(P[1], Q[1])) < 1e-12


def test_several_drafts_are_one_tree_with_one_cache():
    """N chains run as the tree of N branches: one cache per model, never N copies ([N, H, S, D]),
    and one target call of N K + 1 positions."""
    from picospec.autoregressive import buffers
    from picospec.beyond.loop import ModelDraft, speculative_loop
    from picospec.beyond.several import token_branches
    from picospec.beyond.tree import TreeDraft, branches
    from picospec.beyond.tree_verify import tree_step
    target = random_model(n_layer=1, vocab_size=16, n_positions=64)
    draft = ModelDraft(early_exit(random_model(seed=1, n_layer=2, vocab_size=16, n_positions=64), 1))
    N, K = 3, 2
    tokens, prefill_len, max_len = buffers([1, 2], 8, N * K, target.config)
    copies = f"tensor<{N}x{target.config.n_head}x{max_len}x{target.config.head_dim}xf32>"
    text = speculative_loop.lower(TreeDraft(draft, branches(N, K)), target, tokens, 2, jax.random.key(0), 8, N * K,
                                  Sampling(0.8), prefill_len, max_len, -1, verify=token_branches,
                                  step=tree_step).as_text()
    assert "stablehlo.while" in text and copies not in text
    assert f"tensor<{N * K + 1}x{target.config.n_embd}xf32>" in text  # the target's one call: N K + 1 nodes
    # The control: N chains drafted apart (a vmap over their keys) hold N copies of the draft's cache.
    state = loop.start(draft, target, jnp.asarray(tokens), 2, jax.random.key(0), K, prefill_len,
                                       max_len)
    apart = jax.jit(lambda state, keys: jax.vmap(lambda key: draft.propose(state, key, K, Sampling(0.8)))(keys))
    assert copies in apart.lower(state, jax.random.split(jax.random.key(1), N)).as_text()
