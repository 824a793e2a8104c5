"""The lesson reads like the paper: its reading order (the README's table) is its import order, it holds
no platform code, and the fast path behind its one seam computes the same numbers, on CPU only."""

import ast
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from conftest import random_model

from picospec import fastpath
from picospec.gpt2 import forward, init_cache

ROOT = Path(__file__).resolve().parents[1]
ASIDE = {"errors", "fastpath"}  # the one exception and the platform seam: any chapter may use them
PLATFORM_CODE = re.compile(r"optimization_barrier|platform_dependent|/proc/|Mesh|jax\.devices|default_backend")


def reading_order() -> list[str]:
    """The lesson's files in the order of the README's table (| 0 | `picospec/paper.py` | ... |)."""
    rows = re.findall(r"^\| *(\d+) *\| *`picospec/(\w+)\.py` *\|", (ROOT / "README.md").read_text(), re.M)
    assert [int(n) for n, _ in rows] == list(range(len(rows)))
    return [name for _, name in rows]


LESSON = reading_order()


def imports(module: str) -> set[str]:
    """The picospec modules a file imports, by their short names (tools as "tools")."""
    tree = ast.parse((ROOT / "picospec" / f"{module}.py").read_text())
    found = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    found |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    found |= {f"picospec.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
              and node.module == "picospec" for alias in node.names}
    return {name.split(".")[1] for name in found if name.startswith("picospec.")}


def test_each_chapter_imports_only_the_chapters_before_it():
    for i, module in enumerate(LESSON):
        allowed = set(LESSON[:i]) | ASIDE | ({"gpt2", "sampling"} if module == "paper" else set())
        assert imports(module) <= allowed, f"{module}.py imports {imports(module) - allowed}"
    # The controls: the check sees imports, including `from picospec import x`.
    assert "adaptive" in imports("batch") and "speculative" in imports("tools/samplers")


def test_the_table_lists_the_whole_lesson_and_the_core_stands_alone():
    files = {path.stem for path in (ROOT / "picospec").glob("*.py")} - ASIDE - {"__init__", "__main__"}
    assert set(LESSON) == files and LESSON[0] == "paper"
    assert not imports("speculative") & {"verifiers", "adaptive", "several", "ngram", "batch", "theory", "tools"}


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
