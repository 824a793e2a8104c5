"""Many prompts at once: every row is exactly its single-prompt call, and the law holds per row."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import early_exit, random_model
from stats import FAIL, PASS, chi_square_p
from test_speculative import DRAFT, N_PATH, PROMPT, TARGET, V, target_law

import picospec
from picospec import PicospecError, Sampling
from picospec.tools.memory import available_memory, check_memory, compiled_need, memory_per_row
from picospec.tools.samplers import autoregressive_sample_batch, speculative_sample_batch

BIG_TARGET = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
BIG_DRAFT = early_exit(BIG_TARGET, 1)
LENGTHS = (1, 5, 17, 3, 30)  # ragged: buckets 16, 16, 32, 16, 32


def prompts(seed=0, lengths=LENGTHS):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 16, n)] for n in lengths]


@pytest.mark.parametrize("kw, lengths", [
    pytest.param(dict(temperature=0.0), LENGTHS, marks=pytest.mark.slow),
    pytest.param(dict(temperature=0.8, top_k=5, stop_at_eos=True), LENGTHS, marks=pytest.mark.slow),
    (dict(temperature=0.8, top_k=5, stop_at_eos=True), (5, 3, 7, 2))], ids=str)  # one bucket: fewer compiles
def test_every_row_is_its_single_prompt_call(kw, lengths):
    rows = prompts(lengths=lengths)
    keys = jax.random.split(jax.random.key(3), len(rows))
    out, trace = speculative_sample_batch(BIG_DRAFT, BIG_TARGET, rows, 40, keys, K=3, **kw)
    ar = autoregressive_sample_batch(BIG_TARGET, rows, 40, keys, **kw)
    assert out.shape == ar.shape == (len(rows), 40)
    for b, prompt in enumerate(rows):
        spec, t = picospec.speculative_sample(BIG_DRAFT, BIG_TARGET, prompt, 40, keys[b], K=3, **kw)
        np.testing.assert_array_equal(out[b], spec)
        np.testing.assert_array_equal(ar[b], picospec.autoregressive_sample(BIG_TARGET, prompt, 40, keys[b], **kw))
        n = int(t.n_steps)
        assert int(trace.n_steps[b]) == n
        for field in ("drafted", "n_accepted", "extra", "bonus", "u"):  # the same decisions, the same uniforms
            np.testing.assert_array_equal(getattr(trace, field)[b][:n], getattr(t, field)[:n])
        # The probabilities agree to float32 rounding: a batched product may sum in another order.
        for field in ("p", "q"):
            np.testing.assert_allclose(getattr(trace, field)[b][:n], getattr(t, field)[:n], rtol=1e-5, atol=1e-7)
    if kw.get("temperature") == 0.0:
        np.testing.assert_array_equal(out, ar)  # and greedy speculative is greedy autoregressive, per row
    assert len(set(np.asarray(trace.n_steps).tolist())) > 1, "rows should finish after different iterations"


def test_finished_rows_stop_changing():
    """A row that reached <|endoftext|> early keeps eos to the end while the others go on."""
    rows = prompts(seed=4, lengths=(2, 9, 4, 12, 6, 3))
    keys = jax.random.split(jax.random.key(7), len(rows))
    out, trace = speculative_sample_batch(BIG_DRAFT, BIG_TARGET, rows, 60, keys, K=2, stop_at_eos=True)
    eos = BIG_TARGET.config.eos_token_id
    stopped = [b for b in range(len(rows)) if (np.asarray(out[b]) == eos).any()]
    running = [b for b in range(len(rows)) if b not in stopped]
    assert stopped and running, "this seed has rows that stop and rows that run to the end"
    for b in stopped:
        first = int(np.argmax(np.asarray(out[b]) == eos))
        assert (np.asarray(out[b, first:]) == eos).all()
        assert int(trace.n_steps[b]) < max(int(trace.n_steps[r]) for r in running)


def test_batched_ragged_rows_follow_the_target_law():
    """The losslessness test, batched: half the rows have PROMPT, half a longer prompt, interleaved;
    the first three tokens of each half follow the target's exact joint law for its prompt."""
    other = [3, 0, 5, 2, 1, 4]
    rows = [PROMPT if b % 2 == 0 else other for b in range(2 * N_PATH)]
    keys = jax.random.split(jax.random.key(5), len(rows))
    out, _ = speculative_sample_batch(DRAFT, TARGET, rows, 3, keys, K=2, temperature=1.0)
    index = np.asarray(out) @ np.array([V * V, V, 1])  # [B]
    law = target_law(Sampling(1.0))
    assert chi_square_p(index[0::2], law) > PASS
    assert chi_square_p(index[1::2], target_law(Sampling(1.0), prompt=other)) > PASS
    # Control: the rows of one prompt do not follow the other prompt's law, nor the draft's.
    assert chi_square_p(index[1::2], law) < FAIL
    assert chi_square_p(index[0::2], target_law(Sampling(1.0), DRAFT)) < FAIL


def test_a_new_batch_of_the_same_sizes_compiles_nothing(compiles):
    keys = jax.random.split(jax.random.key(0), 3)
    speculative_sample_batch(BIG_DRAFT, BIG_TARGET, prompts(1, (3, 7, 12)), 20, keys, K=3)
    before = compiles.count
    speculative_sample_batch(BIG_DRAFT, BIG_TARGET, prompts(2, (9, 2, 14)), 20, keys, K=3)  # same buckets
    assert compiles.count == before


@pytest.mark.parametrize("rows, keys, message", [
    ([], 0, "no prompts"),
    ([[1, 2], []], 2, "prompt 2 of 2: the prompt is empty"),
    ([[1], [1] * 120], 2, "prompt 2 of 2: prompt (120 tokens) + n-tokens (20) + K=3 exceeds"),
    ([[1], [2]], 3, "one jax.random key per prompt: 2 keys"),
])
def test_bad_batches_are_refused(rows, keys, message):
    with pytest.raises(PicospecError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        speculative_sample_batch(BIG_DRAFT, BIG_TARGET, rows, 20, jax.random.split(jax.random.key(0), keys), K=3)


def test_a_batch_larger_than_memory_is_refused_before_allocating(monkeypatch):
    per_row = memory_per_row([BIG_DRAFT, BIG_TARGET], 128, 4)
    check_memory(1000 * per_row, 1000, available=10 ** 9)  # 1000 small rows fit in 1 GB
    with pytest.raises(PicospecError, match=r"give at most \d+ prompts at once"):
        check_memory(10 ** 6 * per_row, 10 ** 6, available=10 ** 9)
    from picospec.tools import memory
    monkeypatch.setattr(memory, "available_memory", lambda device=None: 10 ** 6)  # as if 1 MB were free
    where = "host" if jax.devices()[0].platform == "cpu" else jax.devices()[0].device_kind
    with pytest.raises(PicospecError, match=rf"but 1.0 MB of {where} memory is free; give at most \d+ prompts"):
        speculative_sample_batch(BIG_DRAFT, BIG_TARGET, [[1]] * 100, 2, jax.random.split(jax.random.key(0), 100))


class FakeGPU:
    """A device as a GPU backend shows itself: its allocator's figures, and a name."""
    platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"

    def memory_stats(self):
        return {"bytes_limit": 80 * 10 ** 9, "bytes_in_use": 70 * 10 ** 9, "peak_bytes_in_use": 75 * 10 ** 9}


def test_free_memory_is_the_devices_own_figure():
    assert available_memory(FakeGPU()) == 10 * 10 ** 9  # bytes_limit - bytes_in_use, not the host's RAM
    with pytest.raises(PicospecError, match=r"but 10.0 GB of NVIDIA H100 80GB HBM3 memory is free"):
        check_memory(9 * 10 ** 9, 4, device=FakeGPU())
    check_memory(7 * 10 ** 9, 4, device=FakeGPU())
    assert available_memory(jax.devices()[0]) > 0  # the CPU: the host's MemAvailable


def test_the_memory_checked_is_the_device_chosen_not_the_default_backend(monkeypatch):
    """A caller who chose a device (jax.default_device, as --platform does) runs there, so that is the
    memory a batch is checked against: here a stand-in GPU chosen on a CPU machine (the host has room)."""
    from picospec.tools import memory
    with jax.default_device(jax.devices("cpu")[0]):
        assert memory.run_device() == jax.devices("cpu")[0]
    monkeypatch.setattr(memory, "run_device", FakeGPU)
    assert memory.available_memory() == 10 * 10 ** 9
    with pytest.raises(PicospecError, match=r"of NVIDIA H100 80GB HBM3 memory is free"):
        check_memory(9 * 10 ** 9, 4)


def test_the_estimate_covers_what_the_compiled_batch_allocates():
    """The batch entry points gate on memory_per_row; the compiled program's own memory_analysis
    must not need more (nor much less: the estimate would refuse batches that fit)."""
    from picospec.beyond.batch import batch_buffers, speculative_batch
    from picospec.beyond.loop import ModelDraft
    rows = [[1, 2, 3]] * 8
    tokens, n_prompt, prefill_len, max_len = batch_buffers(rows, 100, 4, BIG_TARGET.config)
    compiled = speculative_batch.lower(ModelDraft(BIG_DRAFT), BIG_TARGET, tokens, n_prompt,
                                       jax.random.split(jax.random.key(0), 8), 100, 4, Sampling(0.8), prefill_len,
                                       max_len, -1).compile()
    need, estimate = compiled_need(compiled), 8 * memory_per_row([BIG_DRAFT, BIG_TARGET], max_len, 5)
    assert need <= estimate <= 2 * need, (need, estimate)


@pytest.mark.slow  # the n-gram law (test_ngram) and batch rows with a model draft stay in the fast suite
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_ngram_draft_batches_too(temperature):
    rows = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5], [7]]  # repeats to look up, and nothing to look up
    keys = jax.random.split(jax.random.key(0), len(rows))
    draft = picospec.NGramDraft(3)
    out, trace = speculative_sample_batch(draft, BIG_TARGET, rows, 20, keys, K=3, temperature=temperature)
    for b, prompt in enumerate(rows):
        spec, t = picospec.speculative_sample(draft, BIG_TARGET, prompt, 20, keys[b], K=3, temperature=temperature)
        np.testing.assert_array_equal(out[b], spec)
        n = int(t.n_steps)
        assert int(trace.n_steps[b]) == n
        np.testing.assert_array_equal(trace.proposed[b][:n], t.proposed[:n])  # the same lookups hit and missed


def products(fn, *args) -> int:
    """The dot_general operations fn runs, counted at every call site of every nested jaxpr."""
    def count(jaxpr):
        n = 0
        for eqn in jaxpr.eqns:
            n += eqn.primitive.name == "dot_general"
            for param in eqn.params.values():
                inner = getattr(param, "jaxpr", param)
                n += count(inner) if hasattr(inner, "eqns") else 0
        return n
    return count(jax.make_jaxpr(fn)(*args).jaxpr)


def test_the_batch_multiplies_each_weight_once_for_all_rows():
    """vmap batches the products themselves: a batch of 4 rows runs exactly the single row's
    products (each over 4x the rows), where a loop over rows would run 4x as many."""
    from picospec.gpt2 import forward, init_cache
    model = BIG_TARGET
    row = lambda tokens, cache: forward(model, tokens, cache)[0]  # noqa: E731
    cache = init_cache(model.config, 64, np.float32)
    tokens, caches = np.zeros((4, 5), np.int32), jax.tree_util.tree_map(lambda x: np.stack([x] * 4), cache)
    one = products(row, tokens[0], cache)
    assert one > 0 and products(jax.vmap(row), tokens, caches) == one
    looped = lambda t, c: [row(t[b], jax.tree_util.tree_map(lambda x: x[b], c)) for b in range(4)]  # noqa: E731
    assert products(looped, tokens, caches) == 4 * one  # the control: row by row counts 4x


def test_an_iteration_writes_new_positions_and_copies_no_cache():
    """The batched loop selects only a finished row's small state; its caches take the step's writes.
    (A vmap of the one-row loop selects every cache buffer, every iteration: 4 here, 2 per model.)"""
    from picospec.beyond.batch import autoregressive_batch, batch_buffers, speculative_batch
    from picospec.beyond.loop import ModelDraft
    target = random_model(n_layer=1, vocab_size=16, n_positions=64)
    draft = early_exit(random_model(seed=1, n_layer=2, vocab_size=16, n_positions=64), 1)
    tokens, n_prompt, prefill_len, max_len = batch_buffers([[1, 2], [3], [4, 5, 6]], 8, 3, target.config)
    keys = jax.random.split(jax.random.key(0), 3)
    cache = f"tensor<3x{target.config.n_head}x{max_len}x{target.config.head_dim}xf32>"
    spec = speculative_batch.lower(ModelDraft(draft), target, tokens, n_prompt, keys, 8, 3, Sampling(0.8),
                                   prefill_len, max_len, -1).as_text()
    ar = autoregressive_batch.lower(target, tokens, n_prompt, keys, 8, Sampling(0.8), prefill_len, max_len, -1).as_text()
    for text in (spec, ar):
        assert "stablehlo.while" in text and "stablehlo.scatter" in text  # cache writes at each row's position
        assert not [line for line in text.splitlines() if "stablehlo.select" in line and cache in line]
    # The control: a vmap of the one-row loop does select whole caches (the count sees them).
    from picospec.beyond.loop import speculative_loop
    vmapped = jax.jit(lambda d, t, x, n, k: jax.vmap(lambda x, n, k: speculative_loop(
        d, t, x, n, k, 8, 3, Sampling(0.8), prefill_len, max_len, -1))(x, n, k))
    text = vmapped.lower(ModelDraft(draft), target, tokens, n_prompt, keys).as_text()
    assert len([line for line in text.splitlines() if "stablehlo.select" in line and cache in line]) == 4


def test_the_command_lines_one_prompt_is_stepped_as_its_row_copying_no_cache():
    """A batch of one held as its row (batch.over_rows): XLA:CPU's program for its step allocates
    nothing cache-sized. The control: the same step on the batch of one, vmapped, copies its caches."""
    from picospec.fastpath import fast
    stream = importlib.import_module("picospec.tools.cli.iterations")  # what the stream runs
    target = fast(random_model(n_layer=2, n_embd=64, vocab_size=16, n_positions=256))  # caches of 256 KB, as loaded
    tokens, n_prompt, prefill_len, max_len = picospec.beyond.batch.batch_buffers([[1, 2, 3]], 200, 0, target.config)
    state = stream.autoregressive_starts(target, tokens, n_prompt, jax.random.split(jax.random.key(0), 1),
                                         prefill_len, max_len)
    caches = sum(x.nbytes for x in jax.tree_util.tree_leaves(state.cache))

    def allocates(state, n_end):  # bytes of temporaries the compiled, state-donating step needs
        step = jax.jit(stream.autoregressive_iteration, static_argnames="eos_id", donate_argnums=1)
        program = step.lower(target, state, n_end, Sampling(0.8), jnp.array(False), eos_id=-1).compile()
        return program.memory_analysis().temp_size_in_bytes
    assert state.n.ndim == 0 and allocates(state, n_prompt[0] + 200) < caches / 4
    batched = jax.tree_util.tree_map(lambda x: x[None], state)  # the control
    assert allocates(batched, n_prompt + 200) >= caches
