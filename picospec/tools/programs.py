"""The CLI's programs: each traced and compiled once a process, its XLA code kept across runs by JAX's
persistent compilation cache (jit_cache.py). A repeated command still traces and lowers its programs
(about 0.4 s on the bundled pair) but compiles none of them."""

import hashlib
from collections import OrderedDict
from functools import lru_cache, partial
from pathlib import Path

import jax

import picospec
from picospec.tools.memory import run_device

BUILT_HERE: OrderedDict = OrderedDict()  # this process's programs, newest last
KEPT_HERE = 8  # a run uses two to four; each compiled program holds its own memory


def compiled(fn, args: tuple, static: dict, donate: tuple[int, ...] = ()):
    """fn(*args, **static) compiled for these arguments' shapes, types and tree (a model's config is
    part of it): once a process (a batch's prompts share one). donate: the positions of arguments whose
    buffers it may reuse."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    key = (fn, tree, tuple(jax.typeof(x) for x in leaves), tuple(sorted(static.items())), donate, run_device())
    if key not in BUILT_HERE:
        BUILT_HERE[key] = jax.jit(partial(fn, **static), donate_argnums=donate, keep_unused=True).lower(*args).compile()
        while len(BUILT_HERE) > KEPT_HERE:
            BUILT_HERE.popitem(last=False)
    BUILT_HERE.move_to_end(key)
    return BUILT_HERE[key]


@lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over picospec's source files: what is kept from a run (costs.json) is stale after any edit."""
    digest = hashlib.sha256()
    for path in sorted(Path(picospec.__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()
