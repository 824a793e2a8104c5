"""Start without tracing: the CLI's programs, exported once (jax.export) and loaded on later runs.

JAX's persistent cache (jit_cache.py) keeps XLA's compiled code, but to look it up a run must first
trace the Python (model, loop, verifier, policy) and lower it: about a second on the bundled pair,
every run. This keeps the lowered program too. `compiled(fn, args, static, donate)` exports `fn`
(StableHLO in a flatbuffer; nothing is pickled) into programs/NAME.jaxexport in the cache's folder,
NAME a digest of everything it was traced from: the function, the arguments' tree (with the static
parts of every node, such as the model's config), their shapes and dtypes, the static options, the
donated arguments, picospec's source, the jax and jaxlib versions and the device. A later run that finds
the file loads it, traces nothing, and compiles it from JAX's cache. A changed anything gives another
name; a file that cannot be read is rebuilt with a one-line note; deleting the files is always safe.
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
from picospec.beyond.eagle import HeadCache, HeadDraft
from picospec.beyond.eagle_tree import HeadTreeDraft
from picospec.beyond.loop import ModelDraft, Trace
from picospec.beyond.ngram import NGramDraft
from picospec.beyond.policy import Policy
from picospec.beyond.tree import Shape, TreeDraft
from picospec.fastpath import tracing_for
from picospec.gpt2 import GPT2Config, KVCache, Model
from picospec.sampling import Sampling
from picospec.state import SpecState
from picospec.tools.jit_cache import cache_folder
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


for node in (KVCache, SpecState, Trace, DecodeState, ModelDraft, HeadCache):
    export.register_namedtuple_serialization(node, serialized_name=f"picospec.{node.__name__}")
for node in (Model, Sampling, Policy, AdaptiveDraft, NGramDraft, TreeDraft, DynamicDraft, HeadDraft, HeadTreeDraft):
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


BUILT_HERE: OrderedDict = OrderedDict()  # this process's programs by (cache folder, digest), newest last
KEPT_HERE = 8  # a run uses two to four; each compiled program holds its own memory


def compiled(fn, args: tuple, static: dict, donate: tuple[int, ...] = ()):
    """fn(*args, **static) compiled: from the program an earlier run exported, or traced and exported now
    (and saved for the next run); once a process. donate: the positions of arguments it may reuse."""
    kept = (cache_folder(), digest(fn, args, static, donate))  # another folder: as another process
    if kept not in BUILT_HERE:
        program = saved(kept[1], fn, args, static)
        BUILT_HERE[kept] = jax.jit(program.call, donate_argnums=donate, keep_unused=True).lower(*args).compile()
        while len(BUILT_HERE) > KEPT_HERE:
            BUILT_HERE.popitem(last=False)
    BUILT_HERE.move_to_end(kept)
    return BUILT_HERE[kept]


def saved(name: str, fn, args: tuple, static: dict) -> export.Exported:
    """The exported program in programs/name.jaxexport, written there first if an earlier run did not."""
    folder = cache_folder()
    path = folder / "programs" / f"{name}.jaxexport" if folder else None
    try:
        if path and path.exists():
            return export.deserialize(bytearray(path.read_bytes()))
    except Exception as e:  # noqa: BLE001 any damage: a truncated or foreign file
        print(f"picospec: note: rebuilding {path.name}, which could not be read ({type(e).__name__})", file=sys.stderr)
    program = exported(fn, args, static)
    if path:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(program.serialize())
        except OSError:
            pass  # a read-only cache folder: build it again next time
    return program


def exported(fn, args: tuple, static: dict) -> export.Exported:  # traced and lowered: what a saved program skips
    platform = export_platform(run_device())
    with tracing_for(platform):  # one platform: its form alone is traced (fastpath.py)
        return export.export(jax.jit(partial(fn, **static)), platforms=[platform])(*args)


def export_platform(device) -> str:
    """jax.export's name for the device's platform: a GPU's device says "gpu", jax.export wants "cuda" or "rocm"."""
    if device.platform != "gpu":
        return device.platform
    return export.default_export_platform() if jax.default_backend() == "gpu" else "cuda"
