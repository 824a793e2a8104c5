"""The EAGLE head (beyond/eagle.py): exact as every draft is, greedy identical, and fed only true
features. A toy head on a random target of 6 tokens: the first iteration's law written out from the
head's real p and the target's real q, the real loop against the target's law by chi-square (with a
wrong sampler as the control), greedy identity, and the head's cache against one rebuilt from scratch
(with a head that is never rolled back, or never given the target's features, as the controls)."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_verifiers
from conftest import random_model
from stats import FAIL, PASS, chi_square_p
from test_speculative import PROMPT, TARGET, V, target_law
from test_verifiers import add, block_law, token_law

import picospec
from picospec import Sampling
from picospec.autoregressive import buffers, prefill
from picospec.beyond import eagle, loop
from picospec.beyond.adaptive import AdaptiveDraft
from picospec.beyond.eagle import (
    HeadDraft,
    adaptive_head_step,
    catch_up,
    head_forward,
    head_step,
    init_head,
    score_with_features,
)
from picospec.beyond.eagle_tree import HeadTreeDraft, head_tree_step
from picospec.beyond.policy import Policy
from picospec.beyond.tree import Shape
from picospec.beyond.tree_verify import verify_tree
from picospec.sampling import logits_to_probs
from picospec.speculative import accept_or_resample


def toy_head(target=TARGET, seed=0, std=0.5) -> HeadDraft:
    """A random head whose p is far from the target's q (fc random, not the identity it starts as)."""
    params = init_head(target.config, jax.random.key(seed), std)
    C = target.config.n_embd
    params["fc"]["weight"] = std * jax.random.normal(jax.random.key(seed + 1), (C, 2 * C))
    return HeadDraft(params, target.config, target)


HEAD = toy_head()


@functools.lru_cache
def laws(head, drafts, sampling, prompt=tuple(PROMPT)):
    """The head's p[0..K-1] for these drafts, from its own functions as `propose` chains them, and the
    target's q[0..K] from `score_with_features`: the inputs of one iteration's rule."""
    tokens, prefill_len, max_len = buffers(list(prompt), 4, len(drafts), TARGET.config)
    p, q = written_out(head, jnp.int32(drafts), sampling, tokens, len(prompt), prefill_len, max_len)
    return np.float64(p), np.float64(q)


@functools.partial(jax.jit, static_argnums=(4, 5, 6))
def written_out(head, drafts, sampling, tokens, n: int, prefill_len: int, max_len: int):
    K = drafts.shape[0]
    g, p_i, cache = catch_up(head, tokens, n, head.prefill(tokens, n, prefill_len, max_len), K, sampling)
    p = [p_i]
    for d in drafts[:-1]:
        g, logits, cache = head_forward(head, g[None], d[None], cache)
        g = g[0]
        p.append(logits_to_probs(logits[0], sampling))
    proposal = loop.Proposal(drafts, None, None, K)
    q, _, _ = score_with_features(TARGET, tokens, n, proposal, prefill(TARGET, tokens, n, prefill_len, max_len),
                                  sampling)
    return jnp.stack(p), q


def first_token_law(rule_law, K, sampling):
    """P(the first generated token = y): every draft block d with its chance prod p[i](d_i), then the rule."""
    law = {}
    for d in itertools.product(range(V), repeat=K):
        p, q = laws(HEAD, d, sampling)
        chance = np.prod([p[i][d[i]] for i in range(K)])
        if chance > 0:
            for block, prob in rule_law(d, p, q).items():
                add(law, block[:1], chance * prob)
    return np.array([law.get((y,), 0.0) for y in range(V)])


@pytest.mark.parametrize("rule_law", [token_law, block_law], ids=["token", "block"])
def test_the_first_tokens_law_written_out_is_the_targets(rule_law, monkeypatch):
    monkeypatch.setattr(test_verifiers, "V", V)  # its laws, over this vocabulary
    sampling = Sampling(1.0)
    q0 = np.float64(logits_to_probs(picospec.logits(TARGET, PROMPT)[-1], sampling))
    assert np.abs(first_token_law(rule_law, 2, sampling) - q0).max() < 1e-6
    # The real propose reports the p that `laws` writes out, for the drafts it drew.
    tokens, prefill_len, max_len = buffers(PROMPT, 4, 2, TARGET.config)
    state = loop.start(HEAD, TARGET, tokens, len(PROMPT), jax.random.key(5), 2, prefill_len, max_len)
    proposal = HEAD.propose(state, jax.random.key(6), 2, sampling)
    np.testing.assert_allclose(proposal.p, laws(HEAD, tuple(proposal.drafted.tolist()), sampling)[0], atol=1e-6)


def triples(head, n=6_000, **kw):
    keys = jax.random.split(jax.random.key(2), n)
    out = jax.vmap(lambda k: picospec.speculative_sample(head, TARGET, PROMPT, 3, k, K=2, **kw)[0])(keys)
    return np.asarray(out) @ np.array([V * V, V, 1])  # [N] index of (t1, t2, t3)


@pytest.mark.slow  # 6,000 runs of the loop, twice (the exact law above is the fast suite's)
def test_the_loop_samples_the_targets_law_and_a_wrong_head_does_not(monkeypatch):
    sampling = Sampling(2.0, 5)  # a hot temperature: the random target's law is far from one-hot
    assert chi_square_p(triples(HEAD, temperature=2.0, top_k=5), target_law(sampling)) > PASS
    # The control: a head that reports a p other than the one it drew from (a colder one) is off.
    propose = HeadDraft.propose
    monkeypatch.setattr(HeadDraft, "propose", lambda self, state, key, K, s: propose(self, state, key, K, Sampling(0.3))
                        ._replace(p=propose(self, state, key, K, s).p))
    jax.clear_caches()  # the loop compiled with the honest propose
    assert chi_square_p(triples(HEAD, temperature=2.0, top_k=5), target_law(sampling)) < FAIL


def test_greedy_output_is_the_targets_greedy_output():
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    head, rng = toy_head(target, seed=3, std=0.1), np.random.default_rng(0)
    accepted = 0
    for K in (1, 3, 5):
        prompt = list(rng.integers(0, 16, rng.integers(1, 12)))
        spec, trace = picospec.speculative_sample(head, target, prompt, 40, jax.random.key(K), K=K, temperature=0)
        np.testing.assert_array_equal(spec, picospec.autoregressive_sample(target, prompt, 40, jax.random.key(0),
                                                                           temperature=0))
        accepted += int(trace.n_accepted.sum())
    assert accepted > 0  # the head's guesses were judged, and some kept


@functools.partial(jax.jit, static_argnums=2)
def rebuilt(head, tokens, max_len: int, n):
    """The head's cache as a fresh prefill of the sequence so far holds it: what an honest rollback keeps.
    (The prefill reads 32 slots whatever n is: the slots past n are causal scratch, beyond what is compared.)"""
    return head.prefill(tokens, n, 32, max_len)


def stale_features(state):  # the check: the head's slots and features are those of the sequence itself
    n, cache = int(state.n), state.draft_cache
    fresh = rebuilt(HEAD, state.tokens, cache.k[0].shape[1], state.n)
    m = int(cache.length)
    return max(float(jnp.abs(cache.k[0][:, :m] - fresh.k[0][:, :m]).max()),
               float(jnp.abs(cache.f[:n] - fresh.f[:n]).max()))


def run(step, iterations=5, K=3, draft=HEAD):
    tokens, prefill_len, max_len = buffers(PROMPT, 30, K, TARGET.config)
    state = loop.start(draft, TARGET, tokens, len(PROMPT), jax.random.key(1), K, prefill_len, max_len)
    jitted, worst = jax.jit(lambda *args: step(*args), static_argnums=(3, 5)), 0.0  # traced anew: sees a patched draft
    for _ in range(iterations):
        state = jitted(draft, TARGET, state, K, Sampling(1.0), -1)
        worst = max(worst, stale_features(state))
    return worst, state


def test_the_head_reads_only_true_features_and_a_stale_head_is_caught(monkeypatch):
    worst, state = run(head_step)
    assert worst < 1e-4 and int(state.n) > len(PROMPT) + 5  # 5 iterations, and drafts accepted along the way
    # The control: the head's cache never rolled back to the true prefix (and, in the slow set, never given features).
    propose = HeadDraft.propose
    monkeypatch.setattr(HeadDraft, "propose", lambda self, state, key, K, s: (lambda pr: pr._replace(
        cache=pr.cache._replace(length=state.n + K - 1)))(propose(self, state, key, K, s)))
    assert run(head_step)[0] > 1e-3


VARYING = Policy(jnp.float32(0), jnp.float32([1.2, 1.0, 1.05, 1.1]), jnp.float32(0))  # --K auto, K = 3


def test_with_K_auto_the_head_drafts_k_of_K_and_reads_only_true_features():
    worst, state = run(adaptive_head_step, iterations=10, draft=AdaptiveDraft(HEAD, VARYING))
    k = np.asarray(state.trace.k[:int(state.trace.n_steps)])
    assert worst < 1e-4 and len(set(k.tolist())) > 1  # the features of the k scored positions, k moving
    assert int(state.n) > len(PROMPT) + 10  # drafts accepted along the way


def test_with_K_auto_the_heads_calls_stop_at_k_with_the_drafts_of_K(monkeypatch):
    """On the CPU the head under --K auto calls itself k times (its catch-up and k - 1 more), not K: its first k
    drafts and their p are those of K drafts from the same key (adaptive.py cuts the rows past k). The calls are
    counted as they run; the control: k = K makes them all."""
    K, calls = 5, []

    def counted(*args, **kwargs):
        jax.debug.callback(lambda: calls.append(1))
        return head_forward(*args, **kwargs)
    tokens, prefill_len, max_len = buffers(PROMPT, 30, K, TARGET.config)
    state = loop.start(HEAD, TARGET, tokens, len(PROMPT), jax.random.key(1), K, prefill_len, max_len)
    monkeypatch.setattr(eagle, "head_forward", counted)
    full = HEAD.propose(state, jax.random.key(2), K, Sampling(1.0))
    for k in (1, 3, K):
        calls.clear()
        cut = jax.block_until_ready(HEAD.propose(state, jax.random.key(2), K, Sampling(1.0), k=jnp.int32(k)))
        jax.effects_barrier()
        np.testing.assert_array_equal(cut.drafted[:k], full.drafted[:k])
        np.testing.assert_allclose(cut.p[:k], full.p[:k], atol=1e-6)
        assert len(calls) == k


@pytest.mark.slow  # 6,000 runs of the adaptive loop
def test_with_K_auto_the_loop_samples_the_targets_law():
    sampling, policy = Sampling(2.0, 5), Policy(jnp.float32(0), jnp.float32([1.2, 1.0, 1.05]), jnp.float32(0))
    assert chi_square_p(triples(HEAD, temperature=2.0, top_k=5, policy=policy), target_law(sampling)) > PASS


def test_greedy_with_K_auto_and_the_head_is_the_targets_greedy_output():
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    head, prompt = toy_head(target, seed=3, std=0.1), [3, 1, 4, 1, 5]
    spec, trace = picospec.speculative_sample(head, target, prompt, 40, jax.random.key(1), K=3, temperature=0,
                                              policy=VARYING)
    np.testing.assert_array_equal(spec, picospec.autoregressive_sample(target, prompt, 40, jax.random.key(0),
                                                                       temperature=0))
    assert int(trace.n_accepted.sum()) > 0 and len(set(np.asarray(trace.k[:int(trace.n_steps)]).tolist())) > 1


@pytest.mark.slow  # another compile of the loop's step
def test_a_head_never_given_the_targets_features_is_caught():
    assert run(forgetful_step)[0] > 1e-3


def forgetful_step(draft, target, state, K, sampling, eos_id):
    """head_step, but the target's features never reach the head."""
    key, key_draft, key_accept, key_extra = jax.random.split(state.key, 4)
    proposal = draft.propose(state, key_draft, K, sampling)
    q, _, target_cache = score_with_features(target, state.tokens, state.n, proposal, state.target_cache, sampling)
    verdict = accept_or_resample(key_accept, key_extra, proposal.drafted, proposal.p, q, sampling.greedy)
    return loop.advance(state._replace(key=key), proposal, verdict, target_cache, eos_id, proposal.p, q)


# ---- the checkpoint, the CLI, training ----

def test_a_head_checkpoint_loads_for_its_target_and_refuses_another(tmp_path, capsys):
    from conftest import DATA

    from picospec import PicospecError
    from picospec.gpt2 import Model, init_params
    from picospec.tools import cli
    from picospec.tools.checkpoints.head import save_head
    target = picospec.load_model(str(DATA / "tiny-hub"))
    head = toy_head(target, seed=4, std=0.1)
    save_head(head, "tiny-hub", tmp_path / "head")
    loaded = picospec.load_head(str(tmp_path / "head"), target)
    for mine, stored in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(head.params)):
        np.testing.assert_array_equal(mine, np.float16(stored).astype(np.float32))  # float16 files, as shipped
    stranger = Model(target.config, init_params(target.config, jax.random.key(9)))  # same shapes, other weights
    with pytest.raises(PicospecError, match="trained against tiny-hub, and this target's embedding is not"):
        picospec.load_head(str(tmp_path / "head"), stranger)
    with pytest.raises(PicospecError, match="is not an EAGLE head"):
        picospec.load_head(str(DATA / "tiny-hub"), target)
    run = ["--draft", str(tmp_path / "head"), "--target", str(DATA / "tiny-hub"), "--prompt", "a b"]
    for wrong, says in [(["--target", str(DATA / "tiny-prefixed")], "EAGLE head for a 24-wide target"),
                        (["--confidence", "0.5"], "--confidence needs a draft model")]:  # refused before compiling
        assert cli.main(run + wrong) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err


@pytest.mark.slow  # two CLI programs compiled
def test_the_command_line_drafts_greedy_with_a_head(tmp_path, capsys):
    from conftest import DATA

    from picospec.tools import cli
    from picospec.tools.checkpoints.head import save_head
    save_head(toy_head(picospec.load_model(str(DATA / "tiny-hub")), seed=4, std=0.1), "tiny-hub", tmp_path / "head")
    run = ["--draft", str(tmp_path / "head"), "--target", str(DATA / "tiny-hub"), "--prompt", "a b", "--n-tokens", "24",
           "--json"]
    assert cli.main(run + ["--mode", "compare"]) == 0
    assert '"identical": true' in capsys.readouterr().out  # greedy, from the CLI


def test_a_tiny_training_run_is_deterministic_and_learns(monkeypatch):
    from picospec.tools.train import head as training
    monkeypatch.setattr(training, "WINDOW", 24)
    monkeypatch.setattr(training, "BATCH", 2)
    target = random_model(seed=5, vocab_size=16, n_layer=2, n_embd=16, std=0.3)
    tokens = np.tile(np.random.default_rng(0).integers(0, 16, 40), 20).astype(np.int32)  # a text that repeats
    params, curve = training.train_head(target, tokens, 40, seed=0, log=lambda _: None)
    again, curve_again = training.train_head(target, tokens, 40, seed=0, log=lambda _: None)
    assert curve == curve_again and all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                                                jax.tree.leaves(again)))
    assert curve[-1][1] < 0.9 * curve[0][1]  # the loss fell (a head that learns nothing stays within noise of it)


@pytest.mark.slow  # the batch's step and three single-prompt loops compiled
def test_a_batch_with_the_head_gives_each_rows_single_prompt_tokens():
    prompts, keys = [[1, 4], [3, 3, 0, 2], [5]], jax.random.split(jax.random.key(7), 3)
    out, trace = picospec.speculative_sample_batch(HEAD, TARGET, prompts, 12, keys, K=3, temperature=1.0)
    for b, prompt in enumerate(prompts):
        alone, alone_trace = picospec.speculative_sample(HEAD, TARGET, prompt, 12, keys[b], K=3, temperature=1.0)
        np.testing.assert_array_equal(out[b], alone)
        assert int(trace.n_steps[b]) == int(alone_trace.n_steps)


@pytest.mark.slow  # the bundled pair's programs compiled and exported
def test_the_shipped_head_drafts_for_the_bundled_target_from_the_command_line(capsys, tmp_path, monkeypatch):
    import json

    from picospec.tools import cli
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", str(tmp_path / "jit"))  # its programs exported and kept, as a user's are
    assert cli.main(["--draft", "tiny-head", "--target", "tiny-target", "--prompt", "And God said", "--n-tokens", "24",
                     "--K", "4", "--mode", "compare", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] and report["speculative"]["stats"]["acceptance_rate"] > 0.3  # greedy; it drafts well
    assert cli.main(["--draft", "tiny-head", "--target", "tiny-draft", "--prompt", "a"]) == 2  # not its target
    assert "EAGLE head for a 384-wide target" in capsys.readouterr().err


TREE = Shape((0, 0, 1, 2, 3))  # two children of the root, then a chain below each


@pytest.mark.parametrize("children", ["distinct", pytest.param("iid", marks=pytest.mark.slow),
                                      pytest.param("top", marks=pytest.mark.slow)])
def test_a_tree_of_the_heads_guesses_gives_the_targets_greedy_output(children):
    target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    head, prompt = toy_head(target, seed=3, std=0.1), [3, 1, 4, 1, 5]
    spec, trace = picospec.speculative_sample(head, target, prompt, 40, jax.random.key(1), temperature=0, tree=TREE,
                                              children=children)
    np.testing.assert_array_equal(spec, picospec.autoregressive_sample(target, prompt, 40, jax.random.key(0),
                                                                       temperature=0))
    assert int(trace.n_accepted.sum()) > 0


def test_a_tree_hands_the_head_the_accepted_paths_true_features():
    draft, K = HeadTreeDraft(HEAD, TREE, "iid"), TREE.M
    worst, state = run(lambda d, t, s, K, sampling, eos: head_tree_step(d, t, s, K, sampling, eos), 8, K, draft)
    assert worst < 1e-4 and int(state.n) > len(PROMPT) + 8  # drafts accepted along the way


@pytest.mark.slow  # 6,000 runs of the tree loop, twice
def test_a_tree_of_the_heads_guesses_samples_the_targets_law_and_a_wrong_rule_does_not():
    sampling, shape, keys = Sampling(2.0, 5), Shape((0, 0, 1)), jax.random.split(jax.random.key(2), 6_000)

    def law_p(children, rule=verify_tree):
        out = jax.vmap(lambda k: loop.speculative_sample(HeadTreeDraft(HEAD, shape, children), TARGET, PROMPT, 3, k,
                                                         K=shape.M, temperature=2.0, top_k=5, verify=rule,
                                                         step=head_tree_step)[0])(keys)
        return chi_square_p(np.asarray(out) @ np.array([V * V, V, 1]), target_law(sampling))
    assert law_p("distinct") > PASS and law_p("top") > PASS
    # The control: the two most probable children verified as if drawn independently (tree_verify.py says why).
    as_iid = lambda ka, ke, shape, children, tree, q, greedy: verify_tree(ka, ke, shape, "iid", tree, q, greedy)  # noqa: E731
    assert law_p("top", as_iid) < FAIL
