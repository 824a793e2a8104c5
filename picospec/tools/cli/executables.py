"""The CLI's compiled programs kept as XLA executables (programs.py saves them next to their exports).

Looking a compiled program up in JAX's persistent cache still lowers the exported program again and
hashes it: about 0.15 s of a repeated run on the bundled pair. So programs.py keeps XLA's own serialized
executable for this machine as well (`.xla`), and a later run loads it and calls it directly (`Loaded`),
as JAX itself calls it. The file is as trusted as JAX's persistent cache, which holds the same kind.

Loading an executable takes a while (XLA rebuilds its HLO module: ~0.1 s and ~0.25 s for the bundled
pair's start and iteration), and a run asks for them only once it has loaded the models and the prompts.
So the CLI starts loading, in the background as it begins and each in a thread of its own (`load_early`),
the executables the last run of the same command used (programs/last-run: the names each of the last
few commands used, keyed by its flags less the prompts, the seed and the output's form, flags.command):
a repeated command finds them loaded. A run waits for the loading to end before its clock starts
(`settle`): on a machine of few cores a load in the background would slow the run it times, and the
time it waits counts as start-up.
"""

import json
import re
import struct
import time
from collections import namedtuple
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import jax
import numpy as np
from jax import export
from jax.experimental.compilation_cache import compilation_cache

from picospec.tools.memory import run_device


@contextmanager
def fresh_compile():
    """Compile without JAX's persistent cache (it decides once per process whether to use it: reset it)."""
    enabled = jax.config.jax_enable_compilation_cache
    compilation_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()


def load_executable(data, name: str, program: export.Exported, args):
    """The saved executable of `program` (its file starts with the program's digest, `name`), called on
    arguments shaped like `args`."""
    if jax.tree_util.tree_structure((args, {})) != program.in_tree:
        raise ValueError("another program's executable")
    early = loading.pop(name, None)
    return Loaded(*(early.result() if early else deserialize(data, name)), program)


# A program's memory figures, as its memory_analysis() gives them (tools/memory.py reads them before each
# run): kept in its file, since asking a loaded executable takes longer than running it once.
Memory = namedtuple("Memory", ["output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes"])
FIGURES = struct.Struct("<3q")


def saved(name: str, compiled) -> bytes:
    """What an .xla file holds: the program's digest `name`, its memory figures, XLA's serialized executable."""
    m = compiled.memory_analysis()
    figures = FIGURES.pack(m.output_size_in_bytes, m.temp_size_in_bytes, m.alias_size_in_bytes)
    return name.encode() + figures + run_device().client.serialize_executable(compiled.runtime_executable())


def deserialize(data, name: str) -> tuple:
    """(the executable, its Memory) from what `saved` wrote."""
    if data[:len(name)] != name.encode():
        raise ValueError("another program's executable")
    device, start = run_device(), len(name) + FIGURES.size
    executable = device.client.deserialize_executable(bytes(data[start:]), executable_devices=[device])
    return executable, Memory(*FIGURES.unpack_from(data, len(name)))


loading: dict[str, Future] = {}  # name -> the executable being loaded early
used: list[str] = []  # the programs this process asked for, in order
COMMANDS = 8  # the commands last-run keeps, the newest last
command = ""  # this run's key in last-run (load_early)


def last_runs(folder: Path) -> dict:
    """{command: [names of the executables its last run used]} from folder/last-run ({} if none or unreadable)."""
    try:
        runs = json.loads((folder / "last-run").read_text())
    except (OSError, ValueError):
        return {}
    return {key: [name for name in names if isinstance(name, str) and re.fullmatch("[0-9a-f]{32}", name)]
            for key, names in runs.items() if isinstance(names, list)} if isinstance(runs, dict) else {}


def remember(folder: Path, name: str):
    """Name `name` in folder/last-run under this run's command, with the others it used, for the next run
    of the same command to load early."""
    if name not in used:
        used.append(name)
    runs = last_runs(folder)
    runs.pop(command, None)
    runs[command] = used[-8:]
    try:
        (folder / "last-run").write_text(json.dumps(dict(list(runs.items())[-COMMANDS:]), indent=1))
    except OSError:
        pass  # a read-only cache folder: nothing is loaded early


def load_early(folder: Path, key: str):
    """Start loading the executables the last run of command `key` used (folder/last-run), each in a
    background thread of its own: the iteration's, the longest load, then ends while the main thread is
    still reading the models, rather than after the start's."""
    global command
    command = key
    used.clear()  # a process that runs several commands (a notebook) files each under its own
    names = last_runs(folder).get(key, [])
    if not names:
        return
    pool = ThreadPoolExecutor(len(names[:8]), thread_name_prefix="picospec-load")
    for name in names[:8]:
        loading[name] = pool.submit(lambda name: deserialize((folder / f"{name}.xla").read_bytes(), name), name)
    pool.shutdown(wait=False)


def settle() -> float:
    """Wait for the executables still loading early (a failed load is retried when a run asks for it);
    returns the seconds waited."""
    t0 = time.perf_counter()
    for future in list(loading.values()):
        future.exception()
    return time.perf_counter() - t0


@lru_cache(maxsize=64)
def constant(value, dtype) -> jax.Array:  # put on the device as it is: jnp.asarray would compile a conversion
    return jax.device_put(np.asarray(value, dtype))


def is_key(aval) -> bool:  # a jax.random key: its executable takes and gives the key's raw data
    return jax.dtypes.issubdtype(aval.dtype, jax.dtypes.prng_key)


class Loaded:
    """A saved executable, called as the compiled program it was saved from: the arguments' leaves go in
    (donated ones are consumed), the outputs come back in the program's own tree."""

    def __init__(self, executable, memory: Memory, program: export.Exported):
        self.executable, self.memory, self.program = executable, memory, program
        self.keys_in = [i for i, aval in enumerate(program.in_avals) if is_key(aval)]
        self.keys_out = [i for i, aval in enumerate(program.out_avals) if is_key(aval)]

    def __call__(self, *args):
        leaves = jax.tree_util.tree_leaves(args)
        for i, x in enumerate(leaves):
            if not isinstance(x, jax.Array):  # a Python number (a Sampling's temperature): the same each call
                leaves[i] = constant(x, self.program.in_avals[i].dtype)
        for i in self.keys_in:
            leaves[i] = jax.random.key_data(leaves[i])
        outputs = [x[0] for x in self.executable.execute_sharded(leaves).disassemble_into_single_device_arrays()]
        for i in self.keys_out:
            outputs[i] = jax.random.wrap_key_data(outputs[i])
        return jax.tree_util.tree_unflatten(self.program.out_tree, outputs)

    def memory_analysis(self) -> Memory:  # as a compiled program's (tools/memory.py)
        return self.memory
