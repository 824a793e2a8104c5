"""No round trip to the host inside an iteration on an accelerator: counted from the jaxprs as lowered for
"cuda" (tests/round_trips.py), at T = 0.8 with top-k and top-p, for every fixed-K sampler (1: the loop's own
condition) and --K auto (2: its draft loop's length is chosen at run time). The accelerators' branch-free
forms (fastpath.branch_on_cpu) are run here on the CPU too, and give the CPU's tokens."""

import importlib
import json
from functools import partial

import jax
import jax.numpy as jnp
import pytest
from round_trips import per_iteration

import picospec
from picospec import speculative
from picospec.beyond.policy import Policy
from picospec.beyond.tree import branches
from picospec.sampling import Sampling, keep_top_k, keep_top_p

SAMPLED = dict(temperature=0.8, top_k=20, top_p=0.9)
P, KEY = [5, 6, 7], jax.random.key(0)
AUTO = Policy(jnp.float32(0), jnp.float32([4, 5, 6, 7, 8]), jnp.float32(0), prior=jnp.float32([8.0, 2.0]))


@pytest.fixture(scope="module")
def pair():
    return picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")


def samplers_of(draft, target):
    keys, head = jax.random.split(KEY, 2), picospec.load_head("tiny-head", target)
    return {
        "autoregressive": (lambda: picospec.autoregressive_sample(target, P, 8, KEY, **SAMPLED), 1),
        "autoregressive batch": (lambda: picospec.autoregressive_sample_batch(target, [P, P[:2]], 8, keys,
                                                                               **SAMPLED), 1),
        **{f"{rule} rule": (lambda rule=rule: picospec.speculative_sample(draft, target, P, 8, KEY, K=4, verify=rule,
                                                                          **SAMPLED), 1)
           for rule in ("token", "block", "match")},
        "batch of 2": (lambda: picospec.speculative_sample_batch(draft, target, [P, P[:2]], 8, keys, K=4,
                                                                 **SAMPLED), 1),
        "two drafts": (lambda: picospec.speculative_sample(draft, target, P, 8, KEY, K=3, drafts=2, **SAMPLED), 1),
        "tree 2x3": (lambda: picospec.speculative_sample(draft, target, P, 8, KEY, tree=branches(2, 3), **SAMPLED), 1),
        "n-gram draft": (lambda: picospec.speculative_sample(picospec.NGramDraft(), target, P, 8, KEY, K=4,
                                                             **SAMPLED), 1),
        "--K auto": (lambda: picospec.speculative_sample(draft, target, P, 8, KEY, K=4, policy=AUTO, **SAMPLED), 2),
        "--K auto, batch": (lambda: picospec.speculative_sample_batch(draft, target, [P, P[:2]], 8, keys, K=4,
                                                                      policy=AUTO, **SAMPLED), 2),
        "EAGLE head": (lambda: picospec.speculative_sample(head, target, P, 8, KEY, K=4, **SAMPLED), 1),
        "EAGLE head, tree 2x3": (lambda: picospec.speculative_sample(head, target, P, 8, KEY, tree=branches(2, 3),
                                                                     **SAMPLED), 1),
        "EAGLE head, --K auto": (lambda: picospec.speculative_sample(head, target, P, 8, KEY, K=4, policy=AUTO,
                                                                     **SAMPLED), 1),  # it drafts K, cut to k: no loop
    }


def test_an_iteration_waits_for_the_host_at_most_once_on_an_accelerator(pair, monkeypatch):
    counted = {name: per_iteration(run) for name, (run, _) in samplers_of(*pair).items()}
    assert counted == {name: most for name, (_, most) in samplers_of(*pair).items()}


def test_a_run_time_branch_in_the_draft_step_is_counted(pair, monkeypatch, request):
    """The control: the standardization as it was (lax.cond on the traced top-k and top-p), put back in
    the draft's step, makes each draft step and the target's call wait twice: 1 + 2 (K + 1) with K = 4."""
    def with_conds(logits, sampling: Sampling):
        logits = jax.lax.cond(sampling.top_k > 0, partial(keep_top_k, k_bound=sampling.k_bound), lambda x, k: x,
                              logits / sampling.temperature, sampling.top_k)
        return jax.lax.cond(sampling.top_p < 1, keep_top_p, lambda x, p: x, jax.nn.softmax(logits, -1), sampling.top_p)
    monkeypatch.setattr(speculative, "logits_to_probs", with_conds)
    jax.clear_caches()  # the loops were traced with the branch-free form: trace them again, and after
    request.addfinalizer(jax.clear_caches)
    draft, target = pair
    assert per_iteration(lambda: picospec.speculative_sample(draft, target, P, 8, KEY, K=4, **SAMPLED)) == 11
    assert per_iteration(lambda: picospec.speculative_sample(draft, target, P, 8, KEY, K=4, **SAMPLED), on="cpu") == 11


def accelerator_forms(monkeypatch):  # fastpath.branch_on_cpu's other side, wherever it is used
    for module in ("picospec.beyond.score_first", "picospec.beyond.adaptive", "picospec.beyond.policy",
                   "picospec.tools.cli.iterations"):
        monkeypatch.setattr(importlib.import_module(module), "branch_on_cpu",
                            lambda cpu, elsewhere, *args: elsewhere(*args))


def test_the_streamed_batch_in_its_accelerator_form_gives_the_same_tokens(capsys, monkeypatch, tmp_path):
    """The CLI dispatches several iterations at once; on an accelerator those past the end run even when
    every row has finished, keeping each row that was not active: the rows (of different lengths, so
    they finish apart) get the tokens the CPU's branch gives."""
    from test_cli import PAIR, run_cli
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("And God said\nIn\nAnd the LORD spake unto Moses, saying\n")
    flags = [*PAIR, "--prompt-file", str(prompts), "--n-tokens", "6", "--K", "2", "--json"]
    def rows(out):  # each row's tokens and iterations, in the order the rows finished
        return [(r["row"], r["tokens"], r["steps"]) for r in map(json.loads, out.splitlines()[:-1])]
    on_cpu = rows(run_cli(capsys, *flags)[1])
    accelerator_forms(monkeypatch)
    jax.clear_caches()
    code, out, _ = run_cli(capsys, *flags)
    assert code == 0 and len(on_cpu) == 3 and rows(out) == on_cpu


@pytest.mark.slow  # ~30 s a temperature: every program compiled twice
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_accelerators_branch_free_forms_give_the_same_tokens(pair, monkeypatch, temperature):
    """fastpath.branch_on_cpu's other side (score all K + 1 positions, judge either way, decide k's stop
    branch-free, step finished rows and keep them), forced on the CPU: --K auto and the n-gram draft, one
    prompt and a batch of rows of different lengths, give the tokens the CPU's branches give."""
    draft, target = pair
    keys = jax.random.split(KEY, 3)
    prompts = [P, P[:1], [9, 8, 7, 6, 5]]
    sampling = dict(temperature=temperature, top_k=20, top_p=0.9) if temperature else dict(temperature=0.0)

    def runs():
        jax.clear_caches()
        return [picospec.speculative_sample(draft, target, P, 12, KEY, K=4, policy=AUTO, **sampling)[0],
                picospec.speculative_sample_batch(draft, target, prompts, 12, keys, K=4, policy=AUTO, **sampling)[0],
                picospec.speculative_sample(picospec.NGramDraft(), target, P * 3, 12, KEY, K=4, **sampling)[0]]
    on_cpu = runs()
    accelerator_forms(monkeypatch)
    for mine, theirs in zip(runs(), on_cpu):
        assert jnp.array_equal(mine, theirs)
