"""Compiled before it is asked for: a repeated command finds its programs ready.

Compiling an exported program (programs.py) still lowers it and loads XLA's code from JAX's persistent
cache (~0.8 s a repeated run on the bundled pair), and a run asks for it only once it has read the
models. So the CLI starts it as it begins, in a thread of its own for each program the last run of the
same command used (`start_loading`; programs/last-run holds their names, by the command's flags less the
prompts, the seed and the output's form), and a run waits for them before its clock starts (`settle`):
on a machine of few cores a compile beside the run would slow what is timed.
"""

import json
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import jax
from jax import export

from picospec.tools.jit_cache import cache_folder


def compile_exported(program: export.Exported, donate) -> jax.stages.Compiled:
    """The exported program compiled for arguments of its own shapes: the same lowering whether the
    arguments are at hand or not (start_loading), so that JAX's persistent cache finds it either way."""
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in program.in_avals]
    args, _ = jax.tree_util.tree_unflatten(program.in_tree, avals)
    return jax.jit(program.call, donate_argnums=donate, keep_unused=True).lower(*args).compile()


loading: dict[str, Future] = {}  # name -> its program, compiling early
used: list = []  # [name, donated] of the programs this process asked for, in order
COMMANDS = 8  # the commands last-run keeps, the newest last
command = ""  # this run's key in last-run (start_loading)


def last_runs(folder: Path) -> dict:
    """{command: [[name, donated], ...]} from folder/last-run ({} if none or unreadable)."""
    try:
        runs = json.loads((folder / "last-run").read_text())
        return {key: [(name, tuple(donate)) for name, donate in entries if re.fullmatch("[0-9a-f]{32}", name)]
                for key, entries in runs.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def remember(name: str, donate):
    """Name the program in programs/last-run under this run's command, for its next run to load early."""
    folder = cache_folder()
    if folder is None or [name, list(donate)] in used:
        return
    used.append([name, list(donate)])
    runs = {key: [[name, list(donate)] for name, donate in entries]
            for key, entries in last_runs(folder / "programs").items()}
    runs.pop(command, None)
    runs[command] = used[-8:]
    try:
        (folder / "programs" / "last-run").write_text(json.dumps(dict(list(runs.items())[-COMMANDS:]), indent=1))
    except OSError:
        pass  # a read-only cache folder: nothing is compiled early


def load(path: Path, donate) -> jax.stages.Compiled:  # the exported program at path, compiled
    return compile_exported(export.deserialize(bytearray(path.read_bytes())), donate)


def start_loading(key: str):
    """Start compiling the programs the last run of command `key` used, each in a background thread."""
    global command
    command = key
    used.clear()  # a process that runs several commands (a notebook) files each under its own
    folder = cache_folder()
    entries = last_runs(folder / "programs").get(key, []) if folder else []
    if entries:
        pool = ThreadPoolExecutor(len(entries), thread_name_prefix="picospec-load")
        for name, donate in entries:
            loading[name] = pool.submit(load, folder / "programs" / f"{name}.jaxexport", donate)
        pool.shutdown(wait=False)


def settle() -> float:
    """Wait for the programs still compiling early (a failed one is built again when asked for); returns
    the seconds waited."""
    t0 = time.perf_counter()
    for future in list(loading.values()):
        future.exception()
    return time.perf_counter() - t0
