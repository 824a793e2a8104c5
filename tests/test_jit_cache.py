import os
import subprocess
import sys

from picospec.tools.jit_cache import cache_folder

TINY = ["--draft", "tiny-draft", "--target", "tiny-target", "--prompt", "And God said", "--n-tokens", "8"]


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", str(tmp_path / "mine"))
    assert cache_folder() == tmp_path / "mine"
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", "off")
    assert cache_folder() is None
    monkeypatch.delenv("PICOSPEC_JIT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == tmp_path / "xdg" / "picospec" / "jit"


def test_a_second_run_of_the_same_command_compiles_nothing(tmp_path):
    folder = tmp_path / "jit"
    env = {**os.environ, "PICOSPEC_JIT_CACHE": str(folder), "NO_COLOR": "1"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)

    def run():
        out = subprocess.run([sys.executable, "-m", "picospec", *TINY], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "rebuilding" not in out.stderr  # every file the last run kept is whole (the command leaves
        # with os._exit, after writing them)
        return out.stdout, sorted(os.listdir(folder)) + sorted(os.listdir(folder / "programs"))

    text_cold, entries_cold = run()
    assert sum(name.endswith(".jaxexport") for name in entries_cold) == 2  # the start and the iteration, exported
    assert sum(name.startswith("jit_call") for name in entries_cold) >= 2  # and compiled, kept in JAX's cache
    text_warm, entries_warm = run()
    assert entries_warm == entries_cold  # nothing new was traced or compiled, so nothing new was stored
    assert os.listdir(tmp_path) == ["jit"]  # and nothing lands outside the folder the user named
    assert text_warm == text_cold
