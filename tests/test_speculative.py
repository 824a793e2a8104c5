"""The proof that speculative sampling is lossless: one rejection step, the whole loop, greedy."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import early_exit, random_model
from stats import FAIL, PASS, chi_square_p

import picospec
from picospec import PicospecError, Sampling, speculative
from picospec.autoregressive import prefill
from picospec.beyond.verifiers import RULES
from picospec.sampling import logits_to_probs, sample

V = 6
N_SAMPLES = 20_000
N_PATH = 10_000  # samples for the same law through another path (a batch, a tree, a rule, a policy, a lookup)
RNG = np.random.default_rng(0)


def normalized(x):
    x = np.asarray(x, np.float32)
    return x / x.sum()


# (draft p, target q) pairs: random, and the edge cases.
PAIRS = {
    "random": (normalized(RNG.dirichlet(np.ones(V))), normalized(RNG.dirichlet(np.ones(V)))),
    "p equals q": (normalized([1, 2, 3, 4, 5, 6]),) * 2,
    "one-hot draft": (np.eye(V, dtype=np.float32)[2], normalized([3, 1, 4, 1, 5, 9])),
    "disjoint supports": (normalized([1, 1, 1, 0, 0, 0]), normalized([0, 0, 0, 1, 2, 3])),
    "zeros in both": (normalized([0, 5, 1, 0, 3, 1]), normalized([2, 0, 1, 0, 4, 3])),
    "peaked target": (normalized([1, 1, 1, 1, 1, 1]), normalized([0, 0, 0, 0, 1e-3, 1])),
}


def one_step(accept_or_resample, p, q):
    """Draw d ~ p, run `accept_or_resample` with K = 1, return the first emitted token: d if accepted,
    else the resample. Its law must be q."""
    def emit(key):
        key_draft, key_accept, key_extra = jax.random.split(key, 3)
        d = sample(key_draft, jnp.asarray(p))
        a, extra, *_ = accept_or_resample(key_accept, key_extra, d[None], jnp.asarray(p)[None],
                                          jnp.stack([jnp.asarray(q), jnp.asarray(q)]))  # q[1]: the bonus row
        return jnp.where(a == 1, d, extra)
    return jax.jit(jax.vmap(emit))(jax.random.split(jax.random.key(1), N_SAMPLES))


RIGHT_SAMPLER = speculative.accept_or_resample


def wrong_accept_or_resample(key_accept, key_extra, drafted, p, q, greedy=False):
    """A known-wrong sampler for the controls: it resamples from q instead of max(0, q - p)."""
    verdict = RIGHT_SAMPLER(key_accept, key_extra, drafted, p, q, greedy)
    return verdict._replace(extra=sample(key_extra, q[verdict.n_accepted], greedy))


@pytest.mark.parametrize("case", PAIRS)
def test_rejection_step_output_law_is_the_target(case):
    p, q = PAIRS[case]
    assert chi_square_p(one_step(speculative.accept_or_resample, p, q), q) > PASS


def test_rejection_step_control_wrong_residual_is_detected():
    p, q = PAIRS["random"]
    assert chi_square_p(one_step(wrong_accept_or_resample, p, q), q) < FAIL


def test_residual_never_produces_nan_when_p_equals_q():
    p = jnp.asarray(PAIRS["p equals q"][0])
    # Force a rejection (u >= q/p is impossible here, so pass a draft token with q = 0 < p instead).
    q = jnp.array([0.0, 0, 0, 0, 0, 1])
    a, extra, *_ = speculative.accept_or_resample(jax.random.key(0), jax.random.key(1), jnp.array([0]),
                                                  jnp.ones((1, V)) / V, jnp.stack([q, q]))
    assert int(a) == 0 and int(extra) == 5
    a, extra, p_x, q_x, u, *_ = speculative.accept_or_resample(jax.random.key(0), jax.random.key(1),
                                                           jnp.array([3]), p[None], jnp.stack([p, p]))
    assert int(a) == 1 and np.isfinite([p_x, q_x, u]).all()


# ---- the whole loop: the joint law of the first 3 tokens, enumerated exactly ----

DRAFT = random_model(seed=11, vocab_size=V, n_layer=1, std=0.6)
TARGET = random_model(seed=12, vocab_size=V, n_layer=2, std=0.6)
PROMPT = [1, 4]


def target_law(sampling: Sampling, model=TARGET, prompt=PROMPT) -> np.ndarray:
    """P(t1, t2, t3 | prompt) under the standardized model, as a flat [V**3] array."""
    law = np.zeros(V ** 3)
    cond = {}
    for prefix in itertools.chain([()], itertools.product(range(V), repeat=1), itertools.product(range(V), repeat=2)):
        cond[prefix] = np.asarray(logits_to_probs(picospec.logits(model, prompt + list(prefix))[-1], sampling))
    for i, (a, b, c) in enumerate(itertools.product(range(V), repeat=3)):
        law[i] = cond[()][a] * cond[(a,)][b] * cond[(a, b)][c]
    return law


def speculative_triples(K, n=N_SAMPLES, **kw):
    keys = jax.random.split(jax.random.key(2), n)
    out = jax.vmap(lambda k: picospec.speculative_sample(DRAFT, TARGET, PROMPT, 3, k, K=K, **kw)[0])(keys)
    return np.asarray(out) @ np.array([V * V, V, 1])  # [N] index of (t1, t2, t3)


SLOW = pytest.mark.slow  # exhaustive variants: `pytest -m slow`
SETTINGS = [
    pytest.param(dict(K=1, temperature=1.0), marks=SLOW),
    dict(K=4, temperature=1.0),
    pytest.param(dict(K=2, temperature=0.7, top_k=3), marks=SLOW),
    pytest.param(dict(K=3, temperature=1.3, top_p=0.8), marks=SLOW),
    dict(K=2, temperature=0.5, top_k=4, top_p=0.9),
]


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_first_three_tokens_follow_the_target_joint_law(kw):
    sampling = Sampling(kw.get("temperature", 1.0), kw.get("top_k", 0), kw.get("top_p", 1.0))
    assert chi_square_p(speculative_triples(**kw), target_law(sampling)) > PASS


def test_whole_loop_controls_draft_law_and_wrong_residual_are_detected(monkeypatch):
    law, triples = target_law(Sampling(1.0)), speculative_triples(K=2, temperature=1.0)
    assert chi_square_p(triples, law) > PASS  # the same setting, right
    # Control 1: the draft's own law is not the target's, and the test can tell.
    assert chi_square_p(triples, target_law(Sampling(1.0), DRAFT)) < FAIL
    # Control 2: the loop with a wrong residual fails the same test.
    monkeypatch.setitem(RULES, "token", wrong_accept_or_resample)
    jax.clear_caches()
    try:
        assert chi_square_p(speculative_triples(K=2, temperature=1.0), law) < FAIL
    finally:
        monkeypatch.undo()
        jax.clear_caches()


# ---- greedy: token-identical to the target alone ----

@pytest.mark.parametrize("K", [1, pytest.param(2, marks=SLOW), 4, pytest.param(7, marks=SLOW)])
def test_greedy_speculative_equals_greedy_target(K):
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    draft = early_exit(target, 1)
    rng = np.random.default_rng(K)
    accepted = drafted = 0
    for _ in range(12):
        prompt = list(rng.integers(0, 16, rng.integers(1, 20)))
        key = jax.random.key(int(rng.integers(1 << 30)))
        spec, trace = picospec.speculative_sample(draft, target, prompt, 40, key, K=K, temperature=0)
        ar = picospec.autoregressive_sample(target, prompt, 40, key, temperature=0)
        np.testing.assert_array_equal(spec, ar)
        accepted += int(trace.n_accepted.sum())
        drafted += K * int(trace.n_steps)
    assert 0.05 < accepted / drafted < 0.95, "the draft should often disagree, and sometimes agree"


def test_greedy_control_draft_alone_differs():
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    draft = early_exit(target, 1)
    spec, _ = picospec.speculative_sample(draft, target, [1, 2, 3], 40, jax.random.key(0), K=3, temperature=0)
    assert (spec != picospec.autoregressive_sample(draft, [1, 2, 3], 40, jax.random.key(0), temperature=0)).any()


# ---- the trace, purity, and bad input ----

def test_trace_adds_up_and_rebuilds_the_output():
    K, N = 3, 50
    tokens, trace = picospec.speculative_sample(DRAFT, TARGET, PROMPT, N, jax.random.key(3), K=K)
    steps = int(trace.n_steps)
    a = np.asarray(trace.n_accepted[:steps])
    rebuilt = []
    for i in range(steps):
        rebuilt += list(np.asarray(trace.drafted[i, :a[i]])) + [int(trace.extra[i])]
        ratio = np.asarray(trace.q[i] / trace.p[i])
        u = np.asarray(trace.u[i])
        assert (u[:a[i]] < ratio[:a[i]]).all()  # every accepted draft passed u < q/p
        if a[i] < K:
            assert u[a[i]] >= ratio[a[i]]  # and the first rejected one failed it
        assert bool(trace.bonus[i]) == (a[i] == K)
    assert sum(a + 1) >= N > sum(a[:-1] + 1)  # the last iteration reaches n_tokens, no earlier one
    np.testing.assert_array_equal(rebuilt[:N], tokens)
    assert not np.asarray(trace.n_accepted[steps:]).any()  # unused rows stay empty
    assert 0 < a.sum() < K * steps


def test_trace_probabilities_are_the_models_own():
    """Every recorded p[i](d_i) and q[i](d_i) is the draft's and the target's standardized probability
    of d_i after the prefix it was drafted at, recomputed here from scratch with no cache. A draft cache
    off by one after a full accept would pass the law tests above (the target still corrects it) and
    fails this."""
    K, N, sampling = 3, 40, Sampling(0.9)
    full = rejected = 0
    for seed in range(3):
        tokens, trace = picospec.speculative_sample(DRAFT, TARGET, PROMPT, N, jax.random.key(seed), K=K,
                                                    temperature=0.9)
        trace, sequence = jax.device_get(trace), list(PROMPT)
        for i in range(int(trace.n_steps)):
            drafted, a = [int(d) for d in trace.drafted[i]], int(trace.n_accepted[i])
            # One causal pass over the sequence and all K drafts (padded to one length, so it compiles
            # once): row n - 1 + j is the distribution after sequence + d_0..d_{j-1}.
            padded = np.zeros(64, np.int32)
            padded[:len(sequence) + K] = sequence + drafted
            rows = len(sequence) - 1 + np.arange(K)
            p = logits_to_probs(picospec.logits(DRAFT, padded)[rows], sampling)[np.arange(K), drafted]
            q = logits_to_probs(picospec.logits(TARGET, padded)[rows], sampling)[np.arange(K), drafted]
            # Every drafted token, the dropped ones too: each was sampled from its p[j].
            np.testing.assert_allclose(trace.p[i], p, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(trace.q[i], q, rtol=1e-4, atol=1e-6)
            sequence += drafted[:a] + [int(trace.extra[i])]
            full, rejected = full + (a == K), rejected + (a < K)
        np.testing.assert_array_equal(sequence[len(PROMPT):len(PROMPT) + N], tokens)
    assert full >= 3 and rejected >= 3, "the runs must include full accepts and rejections"


def test_same_key_same_output_and_jit_agrees():
    run = lambda k: picospec.speculative_sample(DRAFT, TARGET, PROMPT, 30, k, K=3)[0]  # noqa: E731
    a, b = run(jax.random.key(7)), run(jax.random.key(7))
    np.testing.assert_array_equal(a, b)
    assert (a != run(jax.random.key(8))).any()
    np.testing.assert_array_equal(jax.jit(run)(jax.random.key(7)), a)


def test_exactly_n_tokens_and_stop_at_eos():
    for n in [1, 50]:  # 50: the same compiled loop as the runs below
        tokens, trace = picospec.speculative_sample(DRAFT, TARGET, PROMPT, n, jax.random.key(n), K=4)
        assert tokens.shape == (n,)
    eos = TARGET.config.eos_token_id
    key = jax.random.key(1)  # with this key, eos (token 5) first comes at position 3
    free, _ = picospec.speculative_sample(DRAFT, TARGET, PROMPT, 50, key, K=4)
    tokens, trace = picospec.speculative_sample(DRAFT, TARGET, PROMPT, 50, key, K=4, stop_at_eos=True)
    tokens = np.asarray(tokens)
    first = int(np.argmax(tokens == eos))
    assert tokens[first] == eos and (tokens[first:] == eos).all() and first < 49
    np.testing.assert_array_equal(tokens[:first + 1], np.asarray(free)[:first + 1])
    assert (np.asarray(free)[first:] != eos).any()  # without the option it runs on
    a = np.asarray(trace.n_accepted[:int(trace.n_steps)])
    assert first < sum(a + 1) <= first + 5  # it stopped in the iteration that produced eos


def test_generating_again_compiles_nothing_new(compiles):
    run = lambda prompt, k: picospec.speculative_sample(DRAFT, TARGET, prompt, 24, jax.random.key(k), K=3)  # noqa: E731
    run([1, 2, 3], 0)[0].block_until_ready()
    before = compiles.count
    for k, prompt in enumerate([[1], [2, 3, 4, 5, 1], [0] * 4]):  # other prompts, same buckets
        run(prompt, k)[0].block_until_ready()
    assert compiles.count == before


@pytest.mark.parametrize("kwargs, message", [
    (dict(K=0), "K must be a whole number >= 1"),
    (dict(temperature=-0.5), "temperature must be >= 0"),
    (dict(top_p=2.0), "top-p must be in"),
    (dict(top_k=-1), "top-k must be"),
    (dict(n_tokens=0), "n-tokens must be >= 1"),
    (dict(n_tokens=60), r"prompt \(2 tokens\) \+ n-tokens \(60\) \+ K=4 exceeds the model's context of 64"),
])
def test_bad_arguments_are_refused(kwargs, message):
    args = dict(K=4, n_tokens=10) | kwargs
    n_tokens = args.pop("n_tokens")
    with pytest.raises(PicospecError, match=message):
        picospec.speculative_sample(DRAFT, TARGET, PROMPT, n_tokens, jax.random.key(0), **args)


def test_vocabularies_must_match():
    other = random_model(vocab_size=V + 1)
    with pytest.raises(PicospecError, match="vocabulary .7 tokens. differs from the target's .6."):
        picospec.speculative_sample(other, TARGET, PROMPT, 5, jax.random.key(0))


# ---- step 1 keeps its promise: the draft draws from exactly the p it reports ----

def drafted_and_reported(temperature: float, n_keys: int = 8000, K: int = 3):
    """speculative.propose on DRAFT after PROMPT, for n_keys keys: (drafted [N, K], p [N, K, V], keys)."""
    sampling = Sampling(temperature)
    tokens = jnp.zeros(16, jnp.int32).at[:len(PROMPT)].set(jnp.array(PROMPT))
    cache = prefill(DRAFT, tokens, jnp.int32(len(PROMPT)), 16, 16)
    keys = jax.random.split(jax.random.key(5), n_keys)
    proposal = jax.jit(jax.vmap(lambda key: speculative.propose(DRAFT, tokens, len(PROMPT), cache, key, K,
                                                                sampling)))(keys)
    return np.asarray(proposal.drafted), np.asarray(proposal.p, np.float64), keys


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_each_drafted_token_is_the_inverse_cdf_draw_from_the_p_it_reports(temperature):
    """The acceptance rule divides by p[i](d_i): d_i must be drawn from exactly that p[i]. Checked for
    8,000 keys, draw by draw: with d_i's own key (the i-th of K split from the draft's key), its uniform u
    falls in d_i's interval of the reported p[i]'s CDF, to 1e-6. A draft that samples at another temperature, from
    rounded logits, by argmax or after a top-k its p does not show, fails."""
    drafted, p, keys = drafted_and_reported(temperature)
    K = drafted.shape[1]
    u = np.asarray(jax.vmap(lambda key: jax.vmap(jax.random.uniform)(jax.random.split(key, K)))(keys))  # [N, K]
    cdf = np.cumsum(p, axis=-1)  # [N, K, V]
    u = u * cdf[..., -1]
    upper = np.take_along_axis(cdf, drafted[..., None], -1)[..., 0]  # CDF at d_i
    lower = upper - np.take_along_axis(p, drafted[..., None], -1)[..., 0]  # ... and just before it
    assert ((lower - 1e-6 <= u) & (u < upper + 1e-6)).all()
    assert len(np.unique(drafted[:, 0])) > 2  # the control: real draws, not one token again and again
