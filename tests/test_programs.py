"""The CLI's exported programs (picospec/tools/programs.py): a repeated run traces nothing and finds
XLA's code in JAX's persistent cache, and gives the same tokens; what the program was built from changes
its files; a damaged file is rebuilt with a note."""

import json
import logging
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_cli import PAIR, run_cli

from picospec import load_model
from picospec.gpt2 import logits
from picospec.sampling import Sampling, logits_to_probs
from picospec.tools import programs
from picospec.tools.cli import options

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
    """A new process (this one, its programs and JAX's in-memory caches dropped) runs the same command:
    it traces nothing (the exported programs) and gives the same tokens. The controls: without the
    exported programs it traces; with the folder off, it traces too."""
    code, first, _ = run_cli(capsys, *RUN)
    assert code == 0 and len(files(cache)) == 2  # the batched start and one iteration
    assert any(path.name.startswith("jit_call") for path in cache.parent.iterdir())  # XLA's code, kept by JAX

    def again():
        monkeypatch.setattr(programs, "BUILT_HERE", OrderedDict())
        jax.clear_caches()
        return run_cli(capsys, *RUN)
    export = programs.export.export
    monkeypatch.setattr(programs.export, "export", traced_again)
    code, repeated, _ = again()  # (that it compiles nothing either, a new process shows: test_jit_cache.py)
    assert code == 0 and json.loads(repeated)["tokens"] == json.loads(first)["tokens"]
    for path in cache.glob("*.jaxexport"):
        path.unlink()
    with pytest.raises(AssertionError, match="traced again"):
        again()
    monkeypatch.setattr(programs.export, "export", export)
    again()
    monkeypatch.setattr(programs.export, "export", traced_again)
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", "off")
    with pytest.raises(AssertionError, match="traced again"):
        again()


def test_the_tree_prior_reads_its_laws_from_saved_programs(cache, monkeypatch, caplog):
    """--tree's start-up beyond the stream's programs, the laws at the prompt's positions (options.law),
    come from saved programs, so a repeated run traces none. JAX's in-process caches are cleared before it,
    as a new process starts without them; JAX's own small functions (a key's split) may trace."""
    draft, prompt, sampling = load_model("tiny-draft"), [5, 7, 9], Sampling(0.8)
    ours = {"each_laws", "laws", "logits", "forward", "logits_to_probs"}

    def run():  # -> the laws, and the functions it traced, by name
        monkeypatch.setattr(programs, "BUILT_HERE", OrderedDict())  # as a new process starts
        jax.clear_caches()
        caplog.clear()
        with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax._src.dispatch"):
            result = options.law(draft, [prompt], sampling)[0]
        return result, {m.split()[2] for m in caplog.messages if m.startswith("Finished tracing")}
    laws, first = run()
    laws_again, again = run()
    assert "each_laws" in first and not again & ours
    assert np.array_equal(laws, laws_again)
    # The prompt's rows of the padded call are the model's laws there.
    np.testing.assert_allclose(laws, logits_to_probs(logits(draft, prompt), sampling), atol=1e-6)
    # The control: with no saved programs, each run traces them again.
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", "off")
    monkeypatch.setattr(programs, "BUILT_HERE", OrderedDict())
    assert "each_laws" in run()[1]


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


def test_a_damaged_program_is_rebuilt_with_a_note(capsys, cache, monkeypatch):
    _, first, _ = run_cli(capsys, *RUN)
    start = min(cache.glob("*.jaxexport"), key=lambda path: path.stat().st_size)
    start.write_bytes(start.read_bytes()[:100])  # cut short, as a full disk would leave it
    monkeypatch.setattr(programs, "BUILT_HERE", OrderedDict())  # as a new process starts
    code, again, err = run_cli(capsys, *RUN)
    assert code == 0 and json.loads(again)["tokens"] == json.loads(first)["tokens"]
    assert err.count("picospec: note: rebuilding") == 1 and "Traceback" not in err
    monkeypatch.setattr(programs, "BUILT_HERE", OrderedDict())
    run_cli(capsys, *RUN)
    assert "note" not in capsys.readouterr().err  # rebuilt whole


def test_a_file_names_only_picospec_functions():
    assert programs.function("picospec.beyond.adaptive:own").__name__ == "own"
    with pytest.raises(ValueError, match="not a picospec function"):
        programs.function("os:system")


def test_a_program_for_a_gpu_is_exported_for_cuda(monkeypatch):
    """A CUDA device's platform is "gpu", a name jax.export refuses: it is exported for "cuda" (the
    GPU's run failed on it, "exported for platforms ('gpu',) but used on ('cuda',)")."""
    class GPU:
        platform, device_kind = "gpu", "NVIDIA H200"
    monkeypatch.setattr(programs, "run_device", lambda: GPU())
    assert programs.exported(lambda x: x * 2, (jnp.ones(3),), {}).platforms == ("cuda",)
    assert programs.export_platform(jax.devices("cpu")[0]) == "cpu"


def test_a_program_is_traced_in_its_platforms_form_alone(monkeypatch):
    """programs.exported knows the one platform it lowers for, so fastpath.branch_on_cpu traces that form
    alone (lax.platform_dependent traces both: the bundled pair's --K auto iteration took 2.4 s longer).
    The control: a trace that does not know its platform (the library's jit) traces both."""
    from picospec import fastpath
    traced = []

    def either(x):
        return fastpath.branch_on_cpu(lambda x: traced.append("cpu") or x + 1,
                                      lambda x: traced.append("elsewhere") or x + 1, x)
    programs.exported(either, (jnp.ones(3),), {})
    assert traced == ["cpu"]

    class GPU:
        platform, device_kind = "gpu", "NVIDIA H200"
    monkeypatch.setattr(programs, "run_device", lambda: GPU())
    programs.exported(either, (jnp.ones(3),), {})
    assert traced == ["cpu", "elsewhere"]
    jax.make_jaxpr(either)(jnp.ones(3))
    assert sorted(traced[2:]) == ["cpu", "elsewhere"] and fastpath.TRACING_FOR.get() is None
