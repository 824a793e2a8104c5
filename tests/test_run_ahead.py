"""The stream runs several iterations a dispatch (iterations.run_ahead) and reads them once: the same steps
as one a dispatch, far fewer reads, no dispatch the run does not need, and as many a dispatch as a
model's size allows on its platform."""

import importlib
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import early_exit, random_model
from round_trips import trips

from picospec import load_head, load_model
from picospec.beyond.batch import batch_buffers
from picospec.sampling import Sampling
from picospec.tools.cli.stream import stream
from picospec.tools.samplers import plug_in

iterations = importlib.import_module("picospec.tools.cli.iterations")
stream_module = importlib.import_module("picospec.tools.cli.stream")  # (the package names its function stream)
TARGET = random_model(n_layer=2, vocab_size=16, n_positions=128)
DRAFT = early_exit(TARGET, 1)
PROMPTS = [[1, 2, 3], [4, 5]]


def counted(monkeypatch, most_ahead: int, draft, prompts, n_tokens: int):
    """The stream's steps (each iteration, as the CLI gets them), with how many programs of iterations it
    dispatched and how many reports it read, at most `most_ahead` iterations a dispatch."""
    monkeypatch.setattr(iterations, "MOST_AHEAD", most_ahead)
    dispatches, reads, compile_now, device_get = [0], [0], stream_module.compile_now, jax.device_get

    def counting_compile(fn, *args, **kwargs):
        program, seconds = compile_now(fn, *args, **kwargs)
        if fn is not iterations.run_ahead:
            return program, seconds

        def dispatch(*a):
            dispatches[0] += 1
            return program(*a)
        return dispatch, seconds

    def counting_get(x):
        reads[0] += isinstance(x, tuple) and len(x) >= 3  # a report (ran, running, what each row wrote)
        return device_get(x)
    monkeypatch.setattr(stream_module, "compile_now", counting_compile)
    monkeypatch.setattr(stream_module.jax, "device_get", counting_get)
    keys = jax.random.split(jax.random.key(0), len(prompts))
    steps = [[(s.tokens, s.drafted, s.accepted, s.finished) if s else None for s in it]
             for it in stream(draft, TARGET, prompts, n_tokens, keys, K=3, sampling=Sampling(0.8))]
    monkeypatch.setattr(stream_module.jax, "device_get", device_get)
    return steps, dispatches[0], reads[0]


@pytest.mark.parametrize("draft", [DRAFT, None], ids=["speculative", "autoregressive"])
def test_several_iterations_a_dispatch_give_the_same_steps_with_one_read_each(monkeypatch, draft):
    """8 iterations a dispatch: every iteration's steps as with 1 a dispatch (the control, which reads
    once an iteration), read once a dispatch, and no dispatch beyond ceil(iterations / 8): the stream
    dispatches ahead only what the rows surely still need."""
    one, dispatches_one, reads_one = counted(monkeypatch, 1, draft, PROMPTS, 40)
    eight, dispatches, reads = counted(monkeypatch, 8, draft, PROMPTS, 40)
    assert eight == one and len(one) > 8
    assert reads_one == dispatches_one == len(one)  # the control: one dispatch and one read an iteration
    assert reads == dispatches == math.ceil(len(one) / 8)


def test_a_row_that_finishes_inside_a_dispatch_is_shown_finished_there(monkeypatch):
    """Rows of different lengths finish inside one dispatch: each is shown finished once, at its own
    iteration, and nothing after it (the iterations past its end did nothing)."""
    steps, _, _ = counted(monkeypatch, 8, DRAFT, [[1, 2, 3], [4, 5]], 7)
    for b in range(2):
        row = [it[b] for it in steps]
        last = max(i for i, s in enumerate(row) if s is not None)
        assert row[last][3] and not any(s[3] for s in row[:last] if s is not None)
        assert sum(len(s[0]) for s in row if s is not None) == 7


def test_how_many_a_dispatch_follows_the_weights_an_iteration_reads():
    """The bundled pair's iteration (tens of MB) runs 8 a dispatch on a CPU; GPT-2 124M drafting 4 for
    1558M (8.2 GB an iteration, ~0.3 s on a CPU) runs 1, so each token shows as it comes; on a GPU
    that iteration runs several a dispatch."""
    gpt2_pair = 6.23e9 + 4 * 0.498e9
    assert iterations.run_ahead_for(46e6 + 4 * 8e6, "cpu") == iterations.MOST_AHEAD
    assert iterations.run_ahead_for(gpt2_pair, "cpu") == 1
    assert iterations.run_ahead_for(gpt2_pair, "gpu") >= 4
    draft_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(DRAFT))
    target_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(TARGET))
    assert iterations.weights_read((DRAFT, TARGET), 3) == target_bytes + 3 * draft_bytes
    assert np.isclose(iterations.weights_read((TARGET,), 0), target_bytes)
    target = load_model("tiny-target")  # an EAGLE head holds its target's weights: the target's call reads them
    head = load_head("tiny-head", target)
    target_bytes, head_bytes = (sum(x.nbytes for x in jax.tree_util.tree_leaves(m)) for m in (target, head.params))
    assert iterations.weights_read((head, target), 3) == target_bytes + 3 * head_bytes


@pytest.mark.parametrize("B", [1, 2])
def test_a_dispatch_of_iterations_waits_for_the_host_never_on_an_accelerator(B):
    """The program of 8 iterations, lowered for cuda (counted from its jaxpr: tests/round_trips.py), makes
    no round trip to the host, speculative (K = 3, T = 0.8, top-k, top-p) and autoregressive, for one row
    and two: a scan of static length, each iteration past a row's end run branch-free. The control: its
    CPU form skips those with a cond whose index is computed at run time, one an iteration (and, speculative,
    one more: whether the draft still drafts, asked only until an iteration steps no row)."""
    prompts, keys = PROMPTS[:B], jax.random.split(jax.random.key(0), B)
    n_end, sampling = jnp.int32(15) if B == 1 else jnp.full(B, 15, jnp.int32), Sampling(0.8, 20, 0.9)
    draft, step, rule = plug_in(DRAFT, TARGET, 3)
    tokens, n_prompt, prefill_len, max_len = batch_buffers(prompts, 12, 3, TARGET.config)
    state = jax.eval_shape(partial(iterations.speculative_starts, K=3, prefill_len=prefill_len, max_len=max_len),
                           draft, TARGET, tokens, n_prompt, keys)  # shapes only: nothing is compiled
    speculative = jax.make_jaxpr(partial(iterations.run_ahead, each=iterations.speculative_iteration, n=8, K=3,
                                         eos_id=-1, verify=rule, step=step))((draft, TARGET), state, n_end, sampling)
    tokens, n_prompt, prefill_len, max_len = batch_buffers(prompts, 12, 0, TARGET.config)
    state = jax.eval_shape(partial(iterations.autoregressive_starts, prefill_len=prefill_len, max_len=max_len),
                           TARGET, tokens, n_prompt, keys)
    autoregressive = jax.make_jaxpr(partial(iterations.run_ahead, each=iterations.autoregressive_iteration, n=8,
                                            eos_id=-1))((TARGET,), state, n_end, sampling)
    for program, conds in ((speculative, 16), (autoregressive, 8)):  # the CPU's: whether to step, (and whether
        assert trips(program.jaxpr, "cuda") == 0 and trips(program.jaxpr, "cpu") == conds  # to ask the policy)
