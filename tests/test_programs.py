"""The CLI's exported programs (picospec/tools/cli/programs.py): a repeated run traces nothing and gives
the same tokens; what the program was built from changes its file; a damaged file is rebuilt with a note."""

import json

import pytest
from test_cli import PAIR, run_cli

from picospec.tools.cli import programs

RUN = [*PAIR, "--prompt", "To be", "--n-tokens", "10", "--K", "3", "--json"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", str(tmp_path / "jit"))
    return tmp_path / "jit" / "programs"


def files(folder):
    return sorted(p.name for p in folder.glob("*.jaxexport"))


def traced_again(*args, **kwargs):
    raise AssertionError("traced again")


def test_a_repeated_run_traces_nothing_and_gives_the_same_tokens(capsys, cache, monkeypatch):
    code, first, _ = run_cli(capsys, *RUN)
    assert code == 0 and len(files(cache)) == 2  # the batched start and one iteration
    monkeypatch.setattr(programs.export, "export", traced_again)
    code, again, _ = run_cli(capsys, *RUN)
    assert code == 0 and json.loads(again)["tokens"] == json.loads(first)["tokens"]
    # The control: with the folder off, the same run has to trace.
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", "off")
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
    monkeypatch.setattr(programs, "source_digest", lambda: "edited")  # any edit to picospec's code
    run_cli(capsys, *RUN)
    assert len(files(cache)) == len(built) + 5


def test_a_damaged_program_is_rebuilt_with_a_note(capsys, cache):
    _, first, _ = run_cli(capsys, *RUN)
    for path in cache.glob("*.jaxexport"):
        path.write_bytes(path.read_bytes()[:100])  # cut short, as a full disk would leave it
    code, again, err = run_cli(capsys, *RUN)
    assert code == 0 and json.loads(again)["tokens"] == json.loads(first)["tokens"]
    assert err.count("picospec: note: rebuilding") == 2 and "Traceback" not in err
    run_cli(capsys, *RUN)
    assert "note" not in capsys.readouterr().err  # rebuilt whole


def test_a_file_names_only_picospec_functions():
    assert programs.function("picospec.adaptive:own").__name__ == "own"
    with pytest.raises(ValueError, match="not a picospec function"):
        programs.function("os:system")
