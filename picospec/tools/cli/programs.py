"""Start without tracing: the CLI's programs, exported once (jax.export) and loaded on later runs.

JAX's persistent cache (jit_cache.py) keeps XLA's compiled code, but to look it up a run must first
trace the Python (model, loop, verifier, policy) and lower it to StableHLO: about a second on the
bundled pair, every run. This keeps the lowered program too. `compiled(fn, args, static, donate)`
exports `fn` (jax.export: StableHLO in a flatbuffer; nothing is pickled) into a file named by a
digest of everything the program was traced from: the function's name, the arguments' tree (with the
static parts of every node, such as the model's config), their shapes and dtypes, the static options,
the donated arguments, picospec's own source files, the jax and jaxlib versions and the device. A later
run that finds the file deserializes it: no tracing. The compiled program is kept too, next to its
export (executables.py): a run that finds both neither traces nor compiles.

Anything changed gives another digest, so a stale program is never found; a file that cannot be read
is rebuilt with a one-line note. The files live in programs/ in the compile cache's folder (a few hundred
KB to a few MB each); deleting them is always safe. PICOSPEC_JIT_CACHE=off turns both off: then a process
keeps the last few programs it built in memory, for a later run in the same process (a notebook's).
"""

import dataclasses
import hashlib
import importlib
import json
import os
import sys
from collections import OrderedDict
from functools import lru_cache, partial
from pathlib import Path

import jax
import jaxlib
from jax import export

import picospec
from picospec.autoregressive import DecodeState
from picospec.beyond.adaptive import AdaptiveDraft
from picospec.beyond.dynamic import DynamicDraft, Grown
from picospec.beyond.loop import ModelDraft, Trace
from picospec.beyond.ngram import NGramDraft
from picospec.beyond.policy import Policy
from picospec.beyond.tree import Shape, TreeDraft
from picospec.gpt2 import GPT2Config, KVCache, Model
from picospec.sampling import Sampling
from picospec.state import SpecState
from picospec.tools.cli.executables import fresh_compile, load_early, load_executable, remember, saved
from picospec.tools.cli.jit_cache import cache_folder
from picospec.tools.memory import run_device


def name(fn) -> str:  # a function as the digest and the files spell it
    return f"{fn.__module__}:{fn.__qualname__}"


def function(spelled: str):
    """The picospec function `name` spelled (nothing outside picospec is ever imported from a file)."""
    module, _, qualname = spelled.partition(":")
    if module != "picospec" and not module.startswith("picospec."):
        raise ValueError(f"not a picospec function: {spelled}")
    return getattr(importlib.import_module(module), qualname)


def encode(value):  # a static part of a tree node (a dataclass's meta fields) as JSON
    if callable(value):
        return {"function": name(value)}
    if isinstance(value, GPT2Config):
        return {"GPT2Config": dataclasses.asdict(value)}
    if isinstance(value, Shape):
        return {"Shape": list(value.parents)}
    if isinstance(value, Grown):
        return {"Grown": list(value)}
    return value  # a bool, an int, a string or None


def decode(value):
    if isinstance(value, dict) and "function" in value:
        return function(value["function"])
    if isinstance(value, dict) and "Shape" in value:
        return Shape(tuple(value["Shape"]))
    if isinstance(value, dict) and "Grown" in value:
        return Grown(*value["Grown"])
    if isinstance(value, dict):
        return GPT2Config(**value["GPT2Config"])
    return value


for node in (KVCache, SpecState, Trace, DecodeState, ModelDraft):
    export.register_namedtuple_serialization(node, serialized_name=f"picospec.{node.__name__}")
for node in (Model, Sampling, Policy, AdaptiveDraft, NGramDraft, TreeDraft, DynamicDraft):
    export.register_pytree_node_serialization(
        node, serialized_name=f"picospec.{node.__name__}",
        serialize_auxdata=lambda meta: json.dumps([encode(x) for x in meta]).encode(),
        deserialize_auxdata=lambda raw: tuple(decode(x) for x in json.loads(raw)))


@lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over picospec's source files: any edit to the code makes every program stale."""
    digest = hashlib.sha256()
    for path in sorted(Path(picospec.__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def describe(tree) -> str:
    """A tree's structure with the static parts of every node spelled out (functions by name)."""
    kind, meta = tree.node_data() or (None, None)
    inside = ", ".join(describe(child) for child in tree.children())
    spelled = json.dumps([encode(x) for x in meta] if isinstance(meta, tuple) else repr(meta), default=repr)
    return f"{getattr(kind, '__qualname__', 'leaf')}{spelled}({inside})"


def digest(fn, args, static: dict, donate) -> str:
    leaves, tree = jax.tree_util.tree_flatten(args)
    device = run_device()
    what = [name(fn), describe(tree), [str(jax.typeof(x)) for x in leaves],
            sorted((k, name(v) if callable(v) else repr(v)) for k, v in static.items()), sorted(donate),
            source_digest(), jax.__version__, jaxlib.__version__, device.platform, device.device_kind,
            os.environ.get("XLA_FLAGS", "")]  # flags change the compiled code
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]


BUILT_HERE: OrderedDict = OrderedDict()  # with no cache folder: this process's programs by digest, newest last
KEPT_HERE = 8  # a run uses two to four; each compiled program holds its own memory


def compiled(fn, args: tuple, static: dict, donate: tuple[int, ...] = ()):
    """fn(*args, **static) compiled: the executable an earlier run saved, or compiled now from the exported
    program an earlier run saved, or traced, exported and compiled now (each saved for the next run).
    donate: the positions of arguments whose buffers it may reuse."""
    folder, name = cache_folder(), digest(fn, args, static, donate)
    if folder is None:
        return built_here(name, fn, args, static, donate)
    path = folder / "programs" / f"{name}.jaxexport"
    remember(path.parent, name)
    program = read(path, export.deserialize)
    if program is not None:
        executable = read(path.with_suffix(".xla"), partial(load_executable, name=name, program=program, args=args))
        if executable is not None:
            return executable
    if program is None:
        program = exported(fn, args, static)
        write(path, program.serialize())
    with fresh_compile():  # one JAX's persistent cache loaded would serialize without its kernels (jaxlib 0.10)
        program_compiled = jax.jit(program.call, donate_argnums=donate, keep_unused=True).lower(*args).compile()
    try:
        write(path.with_suffix(".xla"), saved(name, program_compiled))
    except Exception:  # noqa: BLE001 a platform that cannot serialize it: compile it from the export each run
        pass
    return program_compiled


def exported(fn, args: tuple, static: dict) -> export.Exported:  # traced and lowered: the part a saved program skips
    return export.export(jax.jit(partial(fn, **static)), platforms=[run_device().platform])(*args)


def built_here(name: str, fn, args: tuple, static: dict, donate):
    """compiled(...) with nothing on disk: exported and compiled now, or as this process did already."""
    if name not in BUILT_HERE:
        BUILT_HERE[name] = jax.jit(exported(fn, args, static).call, donate_argnums=donate).lower(*args).compile()
        while len(BUILT_HERE) > KEPT_HERE:
            BUILT_HERE.popitem(last=False)
    BUILT_HERE.move_to_end(name)
    return BUILT_HERE[name]


def read(path, load):
    """load(the file's bytes), or None when there is no file, or (with a one-line note) a damaged one."""
    if not path.exists():
        return None
    try:
        return load(bytearray(path.read_bytes()))
    except Exception as e:  # noqa: BLE001 any damage: a truncated or foreign file
        print(f"picospec: note: rebuilding {path.name}, which could not be read ({type(e).__name__})", file=sys.stderr)
        return None


def write(path, data: bytes):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError:
        pass  # a read-only cache folder: build it again next time


def start_loading(command: str):
    """Begin loading, in the background, the executables the last run of `command` used (executables.load_early)."""
    folder = cache_folder()
    if folder:
        load_early(folder / "programs", command)
