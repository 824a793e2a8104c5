"""The CLI's exported programs and their executables (picospec/tools/cli/programs.py, executables.py): a
repeated run traces and compiles nothing, finds its executables loading already, and gives the same
tokens; what the program was built from changes its files; a damaged file is rebuilt with a note."""

import importlib
import json
import logging
import threading
import time
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_cli import PAIR, run_cli

from picospec import load_model
from picospec.beyond.policy import Policy
from picospec.gpt2 import logits
from picospec.sampling import Sampling, logits_to_probs
from picospec.tools.cli import executables, options, programs

stream = importlib.import_module("picospec.tools.cli.stream")  # the module (the package names its function stream)
RUN = [*PAIR, "--prompt", "To be", "--n-tokens", "10", "--K", "3", "--json"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", str(tmp_path / "jit"))
    return tmp_path / "jit" / "programs"


def files(folder, kind="jaxexport"):
    return sorted(p.name for p in folder.glob(f"*.{kind}"))


def traced_again(*args, **kwargs):
    raise AssertionError("traced again")


def compiled_again(*args, **kwargs):
    raise AssertionError("compiled again")


def test_a_repeated_run_traces_nothing_and_gives_the_same_tokens(capsys, cache, monkeypatch):
    """...and finds its executables loading early, all loaded before its clock starts (the prefill and
    every iteration are timed: on a machine of few cores a load beside them would slow what is timed).
    The loads are made slow here, so that the iteration's is still going once the start's is loaded."""
    code, first, _ = run_cli(capsys, *RUN)
    assert code == 0 and len(files(cache)) == len(files(cache, "xla")) == 2  # the batched start and one iteration
    export, fresh_compile = programs.export.export, programs.fresh_compile
    monkeypatch.setattr(programs.export, "export", traced_again)
    monkeypatch.setattr(programs, "fresh_compile", compiled_again)
    threads, timed, deserialize = [], [], executables.deserialize  # where the executables are loaded
    monkeypatch.setattr(executables, "deserialize", lambda *a: threads.append(threading.current_thread().name)
                        or time.sleep(0.2) or deserialize(*a))

    def under_the_clock(compile_now):  # the programs compile_now gives are called only while the clock runs
        def checked(*args, **kwargs):
            program, seconds = compile_now(*args, **kwargs)
            return lambda *a: timed.append(all(f.done() for f in executables.loading.values())) or program(*a), seconds
        return checked
    monkeypatch.setattr(stream, "compile_now", under_the_clock(stream.compile_now))
    code, again, _ = run_cli(capsys, *RUN)
    assert code == 0 and json.loads(again)["tokens"] == json.loads(first)["tokens"]
    assert len(threads) == 2 and all(name.startswith("picospec-load") for name in threads)  # early, as it began
    assert len(timed) > 2 and all(timed)  # the prefill and every iteration: nothing was loading
    # Another command loads none of them (they are not its programs: loading them would only slow it), and
    # the first command, run again after it, still finds its own loaded early.
    threads.clear()
    with monkeypatch.context() as built:  # another command: traced and compiled now
        built.setattr(programs.export, "export", export)
        built.setattr(programs, "fresh_compile", fresh_compile)
        run_cli(capsys, *[x if x != "3" else "2" for x in RUN])
    assert threads == []
    runs = executables.last_runs(cache)  # each command's own start and iteration, though one process ran both
    assert len(runs) == 2 and all(len(names) == 2 for names in runs.values())
    monkeypatch.setattr(stream, "settle", lambda: 0.0)  # and a control: without the wait, the prefill
    timed.clear()  # meets the iteration's load still going
    run_cli(capsys, *RUN)
    assert len(threads) == 2 and all(name.startswith("picospec-load") for name in threads) and not timed[0]
    # The controls: without the last run's names the run loads them itself, when it asks for them; without
    # the executables it compiles; with the folder off, it traces too.
    (cache / "last-run").unlink()
    threads.clear()
    run_cli(capsys, *RUN)
    assert threads == ["MainThread"] * 2
    for path in cache.glob("*.xla"):
        path.unlink()
    with pytest.raises(AssertionError, match="compiled again"):
        run_cli(capsys, *RUN)
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", "off")
    monkeypatch.setattr(programs, "BUILT_HERE", OrderedDict())  # nothing this process built before
    with pytest.raises(AssertionError, match="traced again"):
        run_cli(capsys, *RUN)


def test_auto_reads_its_prior_from_saved_programs(cache, monkeypatch, caplog):
    """--K auto's start-up beyond the stream's programs: the laws at the prompt's positions (its prior,
    options.law) and whether the prior alone stops the draft (stream.asked) come from saved programs, so
    a repeated run traces neither. JAX's in-process caches are cleared before it, as a new process starts
    without them; JAX's own small functions (a key's split) may trace."""
    draft, prompt, sampling = load_model("tiny-draft"), [5, 7, 9], Sampling(0.8)
    policy = Policy(jnp.float32(0), jnp.float32([2.0, 1.0]), jnp.float32(0), prior=jnp.float32([3.0, 1.0]))
    ours = {"laws", "logits", "forward", "logits_to_probs", "prior_stops", "choose_k", "may_stop"}

    def run():  # -> (the laws, the decision), and the functions it traced, by name
        jax.clear_caches()
        caplog.clear()
        with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax._src.dispatch"):
            result = options.law(draft, prompt, sampling), bool(stream.asked(policy, 2))
        return result, {m.split()[2] for m in caplog.messages if m.startswith("Finished tracing")}
    (laws, stops), first = run()
    (laws_again, stops_again), again = run()
    assert {"laws", "prior_stops"} <= first and not again & ours
    assert np.array_equal(laws, laws_again) and stops == stops_again
    # The prompt's rows of the padded call are the model's laws there.
    np.testing.assert_allclose(laws, logits_to_probs(logits(draft, prompt), sampling), atol=1e-6)
    # The control: with no saved programs, each run traces them again.
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", "off")
    monkeypatch.setattr(programs, "BUILT_HERE", OrderedDict())
    assert {"laws", "prior_stops"} <= run()[1]


def test_with_the_folder_off_a_process_runs_its_own_programs_again(capsys, monkeypatch):
    """PICOSPEC_JIT_CACHE=off writes nothing, and a later run in the same process (a notebook's) reuses
    the programs it built, the newest KEPT_HERE of them; another static option is another program."""
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", "off")
    monkeypatch.setattr(programs, "BUILT_HERE", OrderedDict())
    code, first, _ = run_cli(capsys, *RUN)
    assert code == 0 and len(programs.BUILT_HERE) == 2  # the batched start and one iteration
    export = programs.export.export
    monkeypatch.setattr(programs.export, "export", traced_again)
    code, again, _ = run_cli(capsys, *RUN)
    assert code == 0 and json.loads(again)["tokens"] == json.loads(first)["tokens"]
    other_K = [x if x != "3" else "2" for x in RUN]
    with pytest.raises(AssertionError, match="traced again"):  # the control: K is static
        run_cli(capsys, *other_K)
    monkeypatch.setattr(programs.export, "export", export)
    monkeypatch.setattr(programs, "KEPT_HERE", 2)
    assert run_cli(capsys, *other_K)[0] == 0 and len(programs.BUILT_HERE) == 2  # K = 3's were let go
    monkeypatch.setattr(programs.export, "export", traced_again)
    with pytest.raises(AssertionError, match="traced again"):
        run_cli(capsys, *RUN)


def test_what_a_program_was_built_from_names_its_file(capsys, cache, monkeypatch):
    run_cli(capsys, *RUN)
    built = files(cache)
    assert run_cli(capsys, *RUN, "--temperature", "0.7")[0] == 0  # greedy is static: another iteration
    assert run_cli(capsys, *RUN, "--temperature", "0.9")[0] == 0  # only data differ: the same program
    assert len(files(cache)) == len(built) + 1  # sampled and greedy are compiled apart; 0.7 and 0.9 are not
    run_cli(capsys, *[x if x != "3" else "2" for x in RUN])  # K: a static option
    assert len(files(cache)) == len(built) + 3
    fn, args = programs.function("picospec.beyond.adaptive:own"), (jnp.zeros(3),)
    before = programs.digest(fn, args, {}, ())
    monkeypatch.setattr(programs, "source_digest", lambda: "edited")  # any edit to picospec's code
    assert programs.digest(fn, args, {}, ()) != before


def test_a_damaged_program_or_executable_is_rebuilt_with_a_note(capsys, cache):
    _, first, _ = run_cli(capsys, *RUN)
    start, iteration = sorted(cache.glob("*.jaxexport"), key=lambda path: path.stat().st_size)
    start.write_bytes(start.read_bytes()[:100])  # cut short, as a full disk would leave it
    executable = iteration.with_suffix(".xla")
    executable.write_bytes(executable.read_bytes()[:1000])  # likewise (another program's: the test below)
    code, again, err = run_cli(capsys, *RUN)
    assert code == 0 and json.loads(again)["tokens"] == json.loads(first)["tokens"]
    assert err.count("picospec: note: rebuilding") == 2 and ".xla" in err and "Traceback" not in err
    run_cli(capsys, *RUN)
    assert "note" not in capsys.readouterr().err  # rebuilt whole


def test_an_executable_called_directly_gives_what_jit_gives():
    """executables.Loaded takes the arguments' tree as the compiled program does: keys, Python numbers,
    donated buffers (consumed), and the outputs in the program's tree."""
    def step(key, x, scale):
        key, sub = jax.random.split(key)
        return {"key": key, "x": x * scale + jax.random.normal(sub, x.shape)}
    args = (jax.random.key(0), jnp.arange(3.0), 2.0)
    program = jax.export.export(jax.jit(step))(*args)
    compiled = jax.jit(program.call, donate_argnums=(1,), keep_unused=True).lower(*args).compile()
    name = "0" * 32
    loaded = executables.load_executable(data := bytearray(executables.saved(name, compiled)), name, program, args)
    assert loaded.memory_analysis() == tuple(getattr(compiled.memory_analysis(), f) for f in executables.Memory._fields)
    x = jnp.arange(3.0)
    out = loaded(args[0], x, 2.0)
    want = step(*args)
    assert x.is_deleted()  # donated, as the compiled program's would be
    assert jnp.array_equal(jax.random.key_data(out["key"]), jax.random.key_data(want["key"]))
    assert jnp.allclose(out["x"], want["x"])
    with pytest.raises(ValueError, match="another program"):
        executables.load_executable(data, "1" * 32, program, args)


def test_a_file_names_only_picospec_functions():
    assert programs.function("picospec.beyond.adaptive:own").__name__ == "own"
    with pytest.raises(ValueError, match="not a picospec function"):
        programs.function("os:system")
