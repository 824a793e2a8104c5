"""The lesson reads like the paper: it imports only itself, holds no platform code, and the fast path
behind its one seam computes the same numbers, on CPU only."""

import ast
import re
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from conftest import random_model

from picospec import fastpath
from picospec.gpt2 import forward, init_cache

ROOT = Path(__file__).resolve().parents[1]
LESSON = ["paper", "gpt2", "sampling", "draft", "speculative", "verifiers", "adaptive", "several", "state", "ngram", "theory",
          "batch", "errors"]
PLATFORM_CODE = re.compile(r"optimization_barrier|platform_dependent|/proc/|Mesh|jax\.devices|default_backend")


def imports(module: str) -> set[str]:
    tree = ast.parse((ROOT / "picospec" / f"{module}.py").read_text())
    found = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    found |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return {name for name in found if name.startswith("picospec")}


def test_the_lesson_imports_only_the_lesson():
    for module in LESSON:
        for name in imports(module):
            assert name.removeprefix("picospec.") in LESSON, f"{module}.py imports {name}"
    assert "picospec.tools.memory" in imports("tools/batches")  # the control: the check sees imports


def test_the_lesson_holds_no_platform_code():
    for module in LESSON:
        assert not PLATFORM_CODE.search((ROOT / "picospec" / f"{module}.py").read_text()), module
    assert PLATFORM_CODE.search((ROOT / "picospec" / "fastpath.py").read_text())  # the control


def test_the_paper_version_fits_on_a_screen():
    assert len((ROOT / "picospec" / "paper.py").read_text().splitlines()) <= 60


def test_the_fast_path_computes_the_plain_products():
    model = random_model(n_head=2, n_embd=32, vocab_size=40)
    for T in (1, 3, 5):  # 3 and 5 are padded to 4 and 8 rows on CPU
        tokens = jnp.arange(T) % 40
        plain, _ = forward(model, tokens, init_cache(model.config, 16))
        fast, _ = forward(fastpath.fast(model), tokens, init_cache(model.config, 16))
        np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5)


def lowered(platform: str) -> str:
    model = fastpath.fast(random_model(n_head=2, n_embd=32, vocab_size=40))
    run = jax.jit(lambda model, tokens, cache: forward(model, tokens, cache))
    exported = jax.export.export(run, platforms=[platform])(model, jnp.zeros(5, jnp.int32), init_cache(model.config, 16))
    return exported.mlir_module()


def test_the_cpu_formulation_is_compiled_for_cpu_only():
    """Barriers and row padding help XLA:CPU's GEMM library; elsewhere they would stop fusion."""
    assert "optimization_barrier" in lowered("cpu") and "stablehlo.pad" in lowered("cpu")
    for platform in ("cuda", "tpu"):
        text = lowered(platform)
        assert "optimization_barrier" not in text and "stablehlo.pad" not in text, platform


def test_no_tracked_file_speaks_of_how_it_was_made():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not files:  # not a git checkout (an sdist): nothing to check
        return
    words = [r"issue #?\d+", "this " + "session", r"\.\./shared", "no GPU " + "was lent"]  # split: not found here
    process = re.compile("|".join(words), re.I)
    found = [f for f in files if f.endswith((".py", ".md", ".toml", ".ipynb", ".txt"))
             and process.search((ROOT / f).read_text(errors="ignore"))]
    assert not found
