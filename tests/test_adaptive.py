"""Adaptive K: a draft that stops early, by the theory's choice of k or by its own confidence, keeps
every verifier exact (enumerated on a 4-token vocabulary, sampled through the loop), and its choice
of k is the theory module's."""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import early_exit, random_model
from stats import FAIL, PASS, chi_square_p
from test_speculative import DRAFT, N_PATH, TARGET, speculative_triples, target_law
from test_verifiers import (
    RESIDUALS,
    V,
    add,
    block_law,
    markov_tables,
    markov_target_law,
    match_law,
    stream_law,
    token_law,
)

import picospec
from picospec import Sampling
from picospec.beyond import adaptive, theory
from picospec.beyond.policy import ALIKE, Policy, alpha_estimate, choose_k, evidence, fixed
from picospec.beyond.verifiers import RULES
from picospec.sampling import logits_to_probs
from picospec.tools.cli.stream import stream

POLICY = Policy(jnp.float32(0.2), jnp.float32([1.2, 1.0, 1.1, 1.3, 1.6]), jnp.float32(0.3))  # K_max = 4
# K_max = 3, 2 drafts at first, and k = 0 once two drafts were judged and alpha looks below ~1/2: runs
# whose d_0 was accepted stop drafting at the second iteration, the others later.
STOPPING = Policy(jnp.float32(0.2), jnp.float32([0.8, 1.0, 1.0, 1.0]), jnp.float32(0), evidence_to_stop=2)
# With 64 tokens a row in view, a first look pays, and after it k = 0 or not by what it found (worth_a_look):
LOOKING = Policy(jnp.float32(0), jnp.float32([0.6, 1.0, 1.1, 1.2]), jnp.float32(0), horizon=64.0, evidence_to_stop=4)


def padded_block_law(d, p, q):
    """block_law on the arrays the loop passes after a stop: d, p padded to K_max = 3 with zero rows."""
    k = len(d)
    d_pad = d + (0,) * (3 - k)
    p_pad = np.concatenate([p, np.zeros((3 - k, V))])
    q_pad = np.concatenate([q, np.full((3 - k, V), 1 / V)])  # scored past the stop: never read
    return block_law(d_pad, p_pad, q_pad)


def stopping_law(stop, stop_is_rejection=False):
    """One iteration after token x when the draft stops after d_i if stop(x, d[:i+1], p(d_i)) or at K,
    or drafts nothing if stop(x, (), 1.0): the drafts' probability times the rule's law for the k
    drafted. The control treats the stop as a rejection: the extra token comes from
    norm(max(0, q[k] - p[k])) with the draft's unused p[k]."""
    def iteration(rule, x, K, P, Q):
        law = {}

        def judge(drafts, chance):
            seq, k = (x,) + drafts, len(drafts)
            p, q = np.stack([P[seq[i]] for i in range(k)] or [np.zeros((0, V))]), np.stack([Q[seq[i]] for i in range(k + 1)])
            if stop_is_rejection and k < K:
                residual = np.maximum(q[k] - P[seq[k]], 0)
                q = np.concatenate([q[:k], [residual / residual.sum() if residual.sum() > 0 else q[k]]])
            for block, b in rule(drafts, p.reshape(k, V), q).items():
                add(law, block, chance * b)

        def grow(d, prob):
            prev = (x,) + d
            for y in range(V):
                drafts, chance = d + (y,), prob * P[prev[-1]][y]
                if len(drafts) < K and not stop(x, drafts, P[prev[-1]][y]):
                    grow(drafts, chance)
                else:
                    judge(drafts, chance)
        judge((), 1.0) if stop(x, (), 1.0) else grow((), 1.0)
        return law
    return iteration


STOPS = {
    "confidence": lambda x, d, p_d: p_d < 0.35,  # the draft's own probability of its token
    "k from the past": lambda x, d, p_d: len(d) >= 1 + x % 3,  # k decided before drafting, from earlier tokens
    "none, from the past": lambda x, d, p_d: len(d) >= x % 3,  # k = 0 after token 0 or 3: the target alone
}


@pytest.mark.parametrize("stop", STOPS)
def test_stopping_early_keeps_every_rule_exact(stop):
    for seed in range(3):
        P, Q = markov_tables(seed)
        target = markov_target_law(0, 4, Q)
        for rule in (match_law, token_law, padded_block_law):
            law = stream_law(rule, 0, 4, 3, P, Q, {}, stopping_law(STOPS[stop]))
            assert max(abs(law.get(s, 0.0) - target[s]) for s in target) < 1e-6, (rule.__name__, seed)
    # The control: a stop read as a rejection of the draft's next token is not lossless.
    law = stream_law(token_law, 0, 4, 3, P, Q, {}, stopping_law(STOPS[stop], stop_is_rejection=True))
    assert max(abs(law.get(s, 0.0) - target[s]) for s in target) > 1e-3


@pytest.mark.parametrize("rule, law", [("match", match_law), ("token", token_law), ("block", block_law)])
def test_each_rule_as_coded_reads_zero_rows_as_not_proposed(rule, law):
    """One proposed draft of K = 3 (p's other rows zero): the real function samples the K = 1 law."""
    P, Q = markov_tables(1)
    d, p, q = (2, 1, 3), np.stack([P[3], np.zeros(V), np.zeros(V)]), np.stack([Q[3], Q[2], Q[1], Q[0]])
    run = jax.vmap(lambda k1, k2: RULES[rule](k1, k2, jnp.array(d), jnp.float32(p), jnp.float32(q))[:2])
    a, extra = run(jax.random.split(jax.random.key(0), 20_000), jax.random.split(jax.random.key(1), 20_000))
    expected = law((2,), p[:1], q[:2])
    cells = {block: i for i, block in enumerate(expected)}
    assert int(a.max()) <= 1
    index = np.array([cells[d[:int(n)] + (int(y),)] for n, y in zip(a, extra)])
    assert chi_square_p(index, np.array(list(expected.values()))) > PASS
    if rule == "block":  # the weights and residuals up to the stop are the K = 1 ones, exactly
        w, h, r = RESIDUALS(jnp.array(d), jnp.float32(p), jnp.float32(q))
        w1, h1, r1 = RESIDUALS(jnp.array(d[:1]), jnp.float32(p[:1]), jnp.float32(q[:2]))
        np.testing.assert_allclose(np.asarray(h[:2]), np.asarray(h1), atol=1e-6)
        np.testing.assert_allclose(np.asarray(r[:2]), np.asarray(r1), atol=1e-6)
        assert not np.asarray(h[2:]).any()


@pytest.mark.parametrize("rule, which", [pytest.param("token", "confidence", marks=pytest.mark.slow),
                                         pytest.param("token", "stopping", marks=pytest.mark.slow), ("token", "looking"),
                                         pytest.param("block", "confidence", marks=pytest.mark.slow),
                                         pytest.param("block", "stopping", marks=pytest.mark.slow)])
def test_the_adaptive_loop_follows_the_target_joint_law(rule, which):
    law = target_law(Sampling(1.0))
    policy = {"confidence": Policy(POLICY.c, POLICY.v[:4], POLICY.threshold), "stopping": STOPPING,  # K_max = 3
              "looking": LOOKING}[which]
    triples = speculative_triples(K=3, n=N_PATH, temperature=1.0, verify=rule, policy=policy)  # vmapped over keys:
    # a switch runs all its branches; with STOPPING and LOOKING, some keys' second iteration drafts nothing
    assert chi_square_p(triples, law) > PASS
    # The control: the same loop against the draft's law fails (its p underflows to 0 at these N_PATH samples).
    assert chi_square_p(triples, target_law(Sampling(1.0), DRAFT)) < FAIL


GREEDY_CASES = [(0, "block"), pytest.param(1, "match", marks=pytest.mark.slow),
                pytest.param(2, "token", marks=pytest.mark.slow)]


@pytest.mark.parametrize("which, rule", GREEDY_CASES)
def test_greedy_is_the_targets_greedy_output_with_every_policy_and_rule(which, rule):
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    draft = early_exit(target, 1)
    policy = [POLICY, fixed(5, threshold=0.9), Policy(jnp.float32(0.01), jnp.ones(6), 0.0)][which]
    policy = STOPPING if which == 0 and rule == "match" else policy
    for seed, prompt in enumerate([[3], [1, 5, 9, 2], list(range(12))]):
        key = jax.random.key(seed)
        greedy = picospec.autoregressive_sample(target, prompt, 30, key, temperature=0)
        spec, trace = picospec.speculative_sample(draft, target, prompt, 30, key, K=policy.v.shape[0] - 1,
                                                  temperature=0, verify=rule, policy=policy)
        np.testing.assert_array_equal(spec, greedy, err_msg=f"{policy}, {rule}")


def test_a_policy_that_never_stops_is_the_fixed_K_loop_and_stops_show_in_the_trace():
    key = jax.random.key(4)
    plain, _ = picospec.speculative_sample(DRAFT, TARGET, [1, 4], 40, key, K=3)
    same, trace = picospec.speculative_sample(DRAFT, TARGET, [1, 4], 40, key, K=3, policy=fixed(3))
    np.testing.assert_array_equal(plain, same)  # the same keys draft the same tokens
    assert (np.asarray(trace.k[:int(trace.n_steps)]) == 3).all()
    _, trace = picospec.speculative_sample(DRAFT, TARGET, [1, 4], 40, key, K=3, policy=fixed(3, 0.5))
    k, a, n = np.asarray(trace.k), np.asarray(trace.n_accepted), int(trace.n_steps)
    p = np.asarray(trace.p)
    assert 1 <= k[:n].min() and k[:n].max() <= 3 and (k[:n] < 3).any()
    for i in range(n):  # stopped right after the first draft under the threshold, and none after it
        low = np.flatnonzero(p[i] < 0.5)
        assert k[i] == min(3, low[0] + 1 if len(low) else 3)
        assert a[i] <= k[i] and bool(trace.bonus[i]) == (a[i] == k[i])


def test_choose_k_is_the_theorys_optimal_K_and_alpha_comes_from_the_trace():
    chosen = set()
    for c in (0.01, 0.1, 0.4):
        v = np.array([0.9, 1.0, 1.05, 1.2, 1.4, 1.7, 2.0, 2.4, 2.9])  # v(0): the target alone
        policy = Policy(jnp.float32(c), jnp.float32(v), 0.0)
        for alpha in (0.05, 0.3, 0.6, 0.8, 0.95):  # much evidence: the posterior is alpha itself
            s, f = jnp.int32(round(alpha * 10**6)), jnp.int32(round((1 - alpha) * 10**6))
            k = int(choose_k(policy, s, f))
            assert k == theory.optimal_K(alpha, c, lambda K: v[K], 8, K_min=0)
            chosen.add(k)
    assert 0 in chosen and len(chosen) > 2  # not drafting is among the choices the theory makes
    _, trace = picospec.speculative_sample(DRAFT, TARGET, [1, 4], 50, jax.random.key(0), K=4, policy=fixed(4),
                                           temperature=0)
    n = int(trace.n_steps)
    s, f = np.asarray(trace.n_accepted[:n]).sum(), np.sum(np.asarray(trace.n_accepted[:n]) < 4)
    assert tuple(int(x) for x in evidence(trace)) == (s, f)  # at T = 0 beta is the outcome: 1 or 0
    assert np.isclose(float(alpha_estimate(trace)), (s + 1) / (s + f + 2))
    assert abs(theory.alpha_from_trace(trace.n_accepted[:n], 4) - s / (s + f)) < 1e-9


def test_the_evidence_at_T_above_0_is_each_judged_drafts_chance_of_acceptance():
    """beta_i = sum_x min(p, q) at each draft judged, recomputed here from both models' full forward
    passes over the output (an accepted prefix is its context); control: the accept/reject counts."""
    prompt, T = [1, 4], 0.8
    out, trace = picospec.speculative_sample(DRAFT, TARGET, prompt, 40, jax.random.key(3), K=4,
                                             policy=fixed(4), temperature=T)
    x = np.concatenate([prompt, np.asarray(out)])
    p, q = (np.asarray(logits_to_probs(picospec.gpt2.logits(m, x), Sampling(T))) for m in (DRAFT, TARGET))
    beta = np.minimum(p, q).sum(-1)  # [len(x), V] -> [len(x)]: row j is the chance for the token at j + 1
    n, start, successes, failures = int(trace.n_steps) - 1, len(prompt), [], 0.0  # the last may run past out
    for a in np.asarray(trace.n_accepted[:n]):
        judged = beta[start - 1:start - 1 + min(a + 1, 4)]  # d_0..d_a, each after the accepted ones
        successes, failures, start = successes + [judged.sum()], failures + (1 - judged).sum(), start + a + 1
    got = [float(e) for e in evidence(trace._replace(k=trace.k.at[n:].set(0)))]
    np.testing.assert_allclose(got, [sum(successes), failures], rtol=1e-4)
    assert np.abs(np.subtract(successes, trace.n_accepted[:n])).max() > 0.5  # control: not the drafts accepted


def test_choose_k_takes_the_expectation_over_alpha_posterior():
    # Expected tokens per call, E[1 + alpha + ... + alpha^k] under Beta(s + 1, f + 1), integrated
    # numerically; with little evidence it differs from plugging in the posterior mean (the control).
    alpha = np.linspace(0, 1, 200001)
    v = np.array([np.inf, 1.0, 1.1, 1.1, 1.45, 1.45, 1.45, 1.45])  # never k = 0
    policy = Policy(jnp.float32(0.15), jnp.float32(v), 0.0)
    plug_in_differs = False
    for s, f in [(0, 0), (1, 0), (2, 1), (5, 1), (9, 2), (30, 4)]:
        density = alpha**s * (1 - alpha) ** f
        density /= np.trapezoid(density, alpha)
        k = np.arange(1, 8)
        tokens = np.array([np.trapezoid(density * (1 - alpha ** (j + 1)) / np.maximum(1 - alpha, 1e-12), alpha)
                           for j in k])
        best = k[np.argmax(tokens / (k * 0.15 + v[1:]))]
        assert int(choose_k(policy, jnp.int32(s), jnp.int32(f))) == best
        plug_in_differs |= theory.optimal_K((s + 1) / (s + f + 2), 0.15, lambda K: v[K], 7) != best
    assert plug_in_differs


V_B4 = np.array([1.96, 3.99, 5.15, 5.71, 7.93, 8.36, 8.61, 9.16])  # ms per iteration drafting k, B = 4, measured


def tokens_law(alpha, k):  # P(t = 1..k+1): t - 1 drafts accepted, a leading run
    return np.array([alpha**j * (1 - alpha) for j in range(k)] + [alpha**k])


def test_with_a_horizon_choose_k_weighs_the_time_to_finish_and_a_batch_its_slowest_row():
    """One row, R = 64 tokens: the exact expected calls, E[R] = 1 + sum_t P(t) E[R - t] (E[<= 0] = 0),
    times v(k); a batch of 4: the calls until its last row is done, simulated (4000 batches, a fixed
    seed). choose_k's k is within 2% of the best in both. The control: the rate alone (no horizon)
    drafts 7, which a batch of 4 finishes more than 5% later."""
    from picospec.beyond.batch import ROWS, together
    R, B = 64, 4
    policy = Policy(jnp.float32(0), jnp.float32(np.r_[np.inf, V_B4[1:]]), jnp.float32(0),
                             horizon=jnp.float32(R))  # never k = 0
    for alpha in (0.75, 0.89):
        s, f = jnp.float32(alpha * 1e6), jnp.float32((1 - alpha) * 1e6)  # much evidence: alpha itself
        E = np.zeros((8, R + 1))  # [k, R]
        for k in range(1, 8):
            for r in range(1, R + 1):
                E[k, r] = 1 + sum(P * E[k, max(r - t - 1, 0)] for t, P in enumerate(tokens_law(alpha, k)))
        times = V_B4[1:] * E[1:, R]  # [k - 1]
        assert times[int(choose_k(policy, s, f)) - 1] <= 1.02 * times.min(), alpha

    rng, batch_time = np.random.default_rng(0), []
    for k in range(1, 8):
        done, calls = np.zeros((4000, B)), np.zeros(4000)
        while (done < R).any():
            going = (done < R).any(axis=1)
            calls += going
            done += going[:, None] * (1 + rng.choice(k + 1, size=done.shape, p=tokens_law(0.89, k)))
        batch_time.append(V_B4[k] * calls.mean())
    batch_time = np.array(batch_time)  # [k - 1]
    s, f = jnp.float32(0.89e6 / B), jnp.float32(0.11e6 / B)  # each row's share
    ks = jax.vmap(lambda _: choose_k(policy, s, f, together), axis_name=ROWS)(jnp.zeros(B))
    assert len(set(ks.tolist())) == 1 and batch_time[int(ks[0]) - 1] <= 1.02 * batch_time.min()
    rate_alone = dataclasses.replace(policy, horizon=jnp.float32(np.inf))
    assert int(choose_k(rate_alone, 4 * s, 4 * f)) == 7 and batch_time[6] > 1.05 * batch_time.min()


def test_a_batch_drafts_the_k_that_finishes_its_slowest_row_soonest():
    """Two rows of 64 tokens, the target agreeing with one's drafts (alpha 0.9) far more than with the
    other's (0.5): the batch is done when the second row is, so both draft that row's best k, 1. The
    control: the k with the most tokens per unit of time summed over the rows, 3, would finish that row
    more than 15% later."""
    from picospec.beyond.batch import ROWS, furthest, together
    from picospec.beyond.policy import time_per_token
    policy = Policy(jnp.float32(0), jnp.float32(np.r_[np.inf, V_B4[1:]]), jnp.float32(0), horizon=jnp.float32(64))
    alpha = jnp.float32([0.9, 0.5])
    ks = jax.vmap(lambda s, f: choose_k(policy, s, f, together, slowest=furthest), axis_name=ROWS)(alpha * 1e6,
                                                                                                  (1 - alpha) * 1e6)
    per_token = [np.asarray(time_per_token(policy, a ** jnp.arange(8), 2.0, 64.0)) for a in alpha]  # [K+1] each
    summed = 1 + np.argmax(1 / per_token[0][1:] + 1 / per_token[1][1:])
    assert ks.tolist() == [1, 1] == [1 + np.argmin(per_token[1][1:])] * 2
    assert summed == 3 and per_token[1][summed] > 1.15 * per_token[1][1]


def test_a_row_counts_the_other_rows_evidence_as_ALIKE_drafts_at_most():
    """Four rows at B = 4's costs, 12 drafts judged each: three had all accepted, one an unlucky start
    (4 rejected). Alone, that row would draft 1, and so would the batch that followed its own evidence
    (the control, pool = own); counting the others' 36 drafts as 32, the batch drafts 3. With a
    million drafts each (the test above), the others' 32 do not move a row."""
    from picospec.beyond.batch import ROWS, furthest, together
    from picospec.beyond.score_first import own
    policy = Policy(jnp.float32(0), jnp.float32(np.r_[np.inf, V_B4[1:]]), jnp.float32(0), horizon=jnp.float32(64))
    s, f = jnp.float32([8, 12, 12, 12]), jnp.float32([4, 0, 0, 0])
    batch = lambda pool: jax.vmap(lambda s, f: choose_k(policy, s, f, pool, slowest=furthest),  # noqa: E731
                                  axis_name=ROWS)(s, f).tolist()
    assert ALIKE == 32 and batch(together) == [3] * 4
    assert int(choose_k(policy, s[0], f[0])) == 1 and batch(own) == [1] * 4


@pytest.mark.slow
def test_a_batch_drafts_as_far_as_its_furthest_row_and_each_row_is_its_single_call():
    """Rows that stop on their own confidence; `--K auto`'s rows choose k together instead (test above)."""
    prompts, keys = [[1, 4], [3, 3, 0, 5]], jax.random.split(jax.random.key(7), 2)
    policy = fixed(4, threshold=0.3)
    out, trace = picospec.speculative_sample_batch(DRAFT, TARGET, prompts, 12, keys, K=4, policy=policy)
    for b, prompt in enumerate(prompts):
        single, t = picospec.speculative_sample(DRAFT, TARGET, prompt, 12, keys[b], K=4, policy=policy)
        np.testing.assert_array_equal(out[b], single)
        n = int(t.n_steps)  # a finished row's later rows are scratch
        np.testing.assert_array_equal(trace.k[b, :n], t.k[:n])


def test_not_drafting_needs_evidence_first_and_then_stays():
    """k = 0 waits for 16 judged drafts, or for fewer once drafting could not pay even at an optimistic alpha."""
    v = jnp.float32([0.5, 1.0, 1.1, 1.2])  # k = 0 wins at any alpha below ~0.8
    policy = Policy(jnp.float32(0.2), v, 0.0, evidence_to_stop=16)
    assert int(choose_k(policy, jnp.int32(0), jnp.int32(0))) > 0  # no evidence yet: draft
    assert int(choose_k(policy, jnp.int32(12), jnp.int32(1))) > 0  # 13 judged, alpha could pay
    assert int(choose_k(policy, jnp.int32(0), jnp.int32(3))) == 0  # 3 rejections: even 2 sd up it cannot
    assert int(choose_k(policy, jnp.int32(11), jnp.int32(5))) == 0  # 16 judged, alpha ~ 0.7: theory's k = 0
    key = jax.random.key(3)
    out, trace = picospec.speculative_sample(DRAFT, TARGET, [1, 4], 50, key, K=3, temperature=0, policy=policy)
    k, n = np.asarray(trace.k), int(trace.n_steps)
    stopped = np.flatnonzero(k[:n] == 0)
    assert len(stopped) and (k[stopped[0]:n] == 0).all()  # once k = 0, nothing is judged, and it stays
    assert np.asarray(trace.n_accepted[stopped]).sum() == 0 and not np.asarray(trace.p[stopped]).any()
    np.testing.assert_array_equal(out, picospec.autoregressive_sample(TARGET, [1, 4], 50, key, temperature=0))


def test_k_0_waits_until_no_number_of_looks_would_pay_for_itself():
    """The bundled pair's costs (ms, 64 tokens a row). One row, a prior of (2, 1): the posterior
    alone chooses k = 0, but alpha is so uncertain that looking pays, until too few tokens are left for
    what it may find to pay back. Eight rows, their prompts' prior pooled (38, 4):
    no look pays, so the draft stops before its first call (and is never prefilled); the control, the
    rule without a horizon, looks first. Four rows at T = 0.8, (16.4, 3.6) weighed: the draft's prefill is
    what tips the first look; once paid, looks pay. On a GPU (an H200's costs) no look pays even after an
    optimistic prompt of a few tokens: the draft never runs."""
    chosen = jax.jit(choose_k, static_argnames="pool")  # one program for every policy and pool below
    one = Policy(jnp.float32(0), jnp.float32([1.26, 2.46, 2.77, 2.88, 3.85, 3.86, 4.16, 4.34]), jnp.float32(0),
                 horizon=64.0, prefill=0.86)
    assert int(chosen(dataclasses.replace(one, evidence_to_stop=0), 2.0, 1.0)) == 0  # the posterior's choice
    assert int(chosen(one, 2.0, 1.0, first=True)) == 3  # worth a look
    looks = [int(chosen(one, 2.0, 1.0, made=made)) for made in range(0, 64, 4)]
    assert looks[0] == 3 and looks[-1] == 0 and looks == sorted(looks, reverse=True)  # once not worth it, never
    eight = Policy(jnp.float32(0), jnp.float32([2.72, 5.8, 8.14, 9.2, 13.32, 13.47, 14.13, 14.59]), jnp.float32(0),
                   horizon=64.0, prefill=4.48)
    rows8 = lambda x: 8 * x  # noqa: E731  a batch of 8 rows pools its evidence
    assert int(chosen(eight, 38 / 8, 4 / 8, rows8, first=True)) == 0
    assert int(chosen(dataclasses.replace(eight, horizon=jnp.inf), 38 / 8, 4 / 8, rows8, first=True)) > 0
    four = Policy(jnp.float32(0), jnp.float32([1.84, 3.85, 4.85, 5.26, 7.14, 7.56, 8.34, 8.72]), jnp.float32(0),
                  horizon=64.0, prefill=2.57, evidence_to_stop=32)
    rows4 = lambda x: 4 * x  # noqa: E731
    assert int(chosen(four, 4.11, 0.89, rows4, first=True)) == 0 and int(chosen(four, 4.11, 0.89, rows4)) == 3
    gpu = Policy(jnp.float32(0), jnp.float32([0.28, 1.27, 1.46, 1.60, 1.63, 1.77, 1.91, 2.04]), jnp.float32(0),
                 horizon=64.0, prefill=0.3)  # a GPU's: a draft call costs 5-7 target steps, so only alpha ~ 1 pays
    for prior in [(2.57, 0.43), (6.69, 1.31), (8.0, 0.0)]:  # one prompt's, sampled and greedy: optimistic ones
        assert int(chosen(gpu, *prior, first=True)) == 0  # no look pays: the draft never runs
        assert int(chosen(dataclasses.replace(gpu, horizon=jnp.inf), *prior, first=True)) > 0  # the control


@pytest.mark.slow
@pytest.mark.parametrize("policy", [STOPPING, LOOKING])
def test_the_stopping_policies_do_stop_on_some_keys(policy):
    """The joint-law test above with STOPPING and LOOKING exercises k = 0: on some keys the second iteration
    drafts nothing. LOOKING's keys that stop have too few judged drafts for evidence_to_stop, and would draft
    on without a horizon: it is the look rule (worth_a_look) that stops them."""
    keys = jax.random.split(jax.random.key(2), 64)
    traces = jax.vmap(lambda key: picospec.speculative_sample(DRAFT, TARGET, [1, 4], 8, key, K=3, temperature=1.0,
                                                              policy=policy)[1])(keys)
    second = np.asarray(traces.n_steps) >= 2  # the keys that ran a second iteration
    assert 0 < int(np.sum(second & (np.asarray(traces.k[:, 1]) == 0))) < int(np.sum(second))
    if policy is LOOKING:
        for b in np.flatnonzero(second & (np.asarray(traces.k[:, 1]) == 0)):
            first = jax.tree_util.tree_map(lambda x: x[b], traces)
            seen = evidence(first._replace(k=first.k.at[1:].set(0)))  # the first iteration's judged drafts
            made = int(first.n_accepted[0]) + 1
            assert int(choose_k(LOOKING, *seen, made=made)) == 0
            assert int(choose_k(dataclasses.replace(LOOKING, horizon=jnp.inf), *seen, made=made)) > 0


def test_a_batch_chooses_one_k_for_all_its_rows():
    prompts, keys = [[1, 4], [3, 3, 0, 5], [2]], jax.random.split(jax.random.key(7), 3)
    _, trace = picospec.speculative_sample_batch(DRAFT, TARGET, prompts, 30, keys, K=3, temperature=1.0,
                                                 policy=STOPPING)
    k, n = np.asarray(trace.k), np.asarray(trace.n_steps)
    first = int(n.min())  # iterations every row ran
    assert (k[:, :first] == k[:1, :first]).all() and (k[:, :first] == 0).any() and (k[:, :first] > 0).any()


@pytest.mark.slow  # the CLI's stream and the batch loop compiled for auto (about 12 s)
def test_the_stream_stops_drafting_where_the_batch_does_and_gives_its_tokens():
    """Once k = 0 is chosen the loops go on with the target alone (speculative.target_alone); the CLI's
    stream switches programs there. Same tokens, same k per iteration, and k = 0 to the end."""
    prompts, keys = [[1, 4], [3, 3, 0, 5]], jax.random.split(jax.random.key(7), 2)
    out, trace = picospec.speculative_sample_batch(DRAFT, TARGET, prompts, 12, keys, K=3, temperature=1.0,
                                                   policy=STOPPING)
    rows = [[], []]
    for iteration in stream(DRAFT, TARGET, prompts, 12, keys, K=3, sampling=Sampling(1.0), policy=STOPPING):
        for b, step in enumerate(iteration):
            if step is not None:
                rows[b].append(step)
    for b in range(2):
        n = int(trace.n_steps[b])
        k = np.asarray(trace.k[b, :n])
        assert (k == 0).any() and (k[np.argmax(k == 0):] == 0).all()  # it stopped, for good
        assert [s.k for s in rows[b]] == k.tolist()
        np.testing.assert_array_equal(sum((s.tokens for s in rows[b]), []), out[b])


def test_a_draft_the_prior_stops_is_never_prefilled_and_a_batch_decides_it_together():
    """Its cache stays empty exactly when the loop will not draft (batch_drafting false at the start).
    Prior (3, 17) a row: alone, 20 judged drafts, alpha ~ 0.18 could still pay 2 sd up, so it drafts;
    four rows pool 80, past evidence_to_stop, and at alpha ~ 0.16 k = 0 wins. The control: deciding
    row by row, as the start did before, would prefill drafts the batch never runs."""
    from picospec.beyond.batch import ROWS, batch_buffers, batch_drafting, batch_start, in_batch
    from picospec.beyond.loop import ModelDraft, start
    v, K = jnp.float32([1.0, 1.2, 1.4, 1.6]), 3
    policy = Policy(jnp.float32(0), v, jnp.float32(0), prior=jnp.float32([3, 17]))
    draft = adaptive.AdaptiveDraft(ModelDraft(DRAFT), policy)
    prefilled = lambda state: bool(jnp.any(state.draft_cache.k[0] != 0))  # noqa: E731
    tokens, n_prompt, prefill_len, max_len = batch_buffers([[1, 4], [3, 3, 0], [2], [5, 1]], 8, K, TARGET.config)
    keys = jax.random.split(jax.random.key(0), 4)

    @partial(jax.jit, static_argnames="axis_name")
    def starts(row_draft, axis_name=None):
        row = lambda x, n, key: start(row_draft, TARGET, x, n, key, K, prefill_len, max_len)  # noqa: E731
        return jax.vmap(row, axis_name=axis_name)(tokens, n_prompt, keys)
    batched = jax.jit(lambda: batch_start(draft, TARGET, tokens, n_prompt, keys, K, prefill_len, max_len))
    assert int(choose_k(policy, *policy.prior)) > 0  # one row alone drafts
    for state in [starts(in_batch(draft), ROWS), batched()]:  # by hand, and as the batch and the stream start
        assert not prefilled(state) and not bool(batch_drafting(in_batch(draft), state))
    assert prefilled(starts(draft))  # the control: each row on its own prior would prefill


def test_a_prior_that_stops_the_draft_decodes_as_autoregressive_sampling_does(monkeypatch):
    """When the prior alone chooses k = 0 (the draft never runs), the loop steps the target alone from the
    first iteration: every token is autoregressive sampling's from the same keys (sampled, a row stopping
    at <|endoftext|>), every iteration drafted nothing, and the CLI's stream shows the same. The control:
    a prior that drafts drafts."""
    from picospec.tools import samplers
    v, K, n = jnp.float32([1.0, 1.5, 1.8, 2.0]), 3, 12  # drafting pays only if alpha is high
    doubtful = Policy(jnp.float32(0), v, jnp.float32(0), prior=jnp.float32([1, 20]), horizon=jnp.float32(n))
    prompts, keys = [[1, 4], [3, 3, 0], [2]], jax.random.split(jax.random.key(1), 3)
    out = picospec.autoregressive_sample_batch(TARGET, prompts, n, keys, temperature=0.8, stop_at_eos=True)
    got, trace = picospec.speculative_sample_batch(DRAFT, TARGET, prompts, n, keys, K=K, temperature=0.8,
                                                   stop_at_eos=True, policy=doubtful)
    np.testing.assert_array_equal(got, out)
    assert int(trace.n_steps[0]) < n  # the first row stopped at <|endoftext|>
    for b, steps in enumerate(np.asarray(trace.n_steps)):
        assert not np.asarray(trace.k[b, :steps]).any()  # never drafted
    rows = [[], [], []]  # the CLI's stream
    for iteration in stream(DRAFT, TARGET, prompts, n, keys, K=K, sampling=Sampling(0.8),
                            eos_id=TARGET.config.eos_token_id, policy=doubtful):
        for b, step in enumerate(iteration):
            rows[b] += [step] if step is not None else []
    for b in range(3):
        assert len(rows[b]) == int(trace.n_steps[b]) and not any(step.proposed for step in rows[b])
        np.testing.assert_array_equal(sum((step.tokens for step in rows[b]), []), out[b, :int(trace.n_steps[b])])
    drafting = dataclasses.replace(doubtful, prior=jnp.float32([20, 1]))
    _, trace = samplers.speculative_sample_batch(DRAFT, TARGET, prompts, n, keys, K=K, temperature=0.8,
                                                 stop_at_eos=True, policy=drafting)  # the same program: a policy is data
    assert np.asarray(trace.k[:, 0]).all()  # the control: this prior drafts from the first iteration


def test_a_model_draft_compiles_no_block_of_one_position():
    """A model drafts one token at least every iteration it drafts, so its step's score_first compiles no
    branch for one position (the bundled pair's auto iteration program: 4.3 MB -> 3.7 MB); a lookup, which
    may find nothing, keeps it. Counted in the step's traced program: the switch's branches."""
    from round_trips import jaxprs

    from picospec.beyond.loop import start
    from picospec.beyond.ngram import NGramDraft
    from picospec.beyond.score_first import score_sizes
    from picospec.tools import samplers
    assert score_sizes(7) == [1, 4, 8] and score_sizes(7, least=1) == [4, 8] and score_sizes(2, least=2) == [3]
    assert score_sizes(1) == [1, 2] and score_sizes(3, least=1) == [4]

    def switch(draft):  # the most branches of a switch in one iteration's program
        draft, step, verify = samplers.plug_in(draft, TARGET, 7, policy=fixed(7))

        def iteration():
            state = start(draft, TARGET, jnp.ones(24, jnp.int32), 4, jax.random.key(0), 7, 4, 24)
            return step(draft, TARGET, state, 7, Sampling(1.0), -1, verify)
        return branches(jax.make_jaxpr(iteration)().jaxpr)

    def branches(jaxpr):  # the most branches of a cond or switch within, nested ones too
        inner = [branches(sub) for e in jaxpr.eqns for sub in jaxprs(e.params)]
        mine = [len(e.params["branches"]) for e in jaxpr.eqns if e.primitive.name == "cond"]
        return max(inner + mine + [0])
    assert switch(DRAFT) == 2 and switch(NGramDraft(2)) == 3
