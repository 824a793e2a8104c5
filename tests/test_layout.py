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


def reading_order(folder: str) -> list[str]:
    """One part's files in the order of its README table (| 0 | `picospec/paper.py` | ... |)."""
    rows = re.findall(rf"^\| *(\d+) *\| *`{folder}/(\w+)\.py` *\|", (ROOT / "README.md").read_text(), re.M)
    assert [int(n) for n, _ in rows] == list(range(len(rows)))
    return [name for _, name in rows]


PART_I, PART_II = reading_order("picospec"), reading_order("picospec/beyond")
LESSON = PART_I + [f"beyond/{name}" for name in PART_II]  # the files, under picospec/


def imports(module: str) -> set[str]:
    """The picospec modules a file (picospec/{module}.py) imports: Part I's and the aside by their short
    names, Part II's as beyond/name, the tools as "tools"."""
    tree = ast.parse((ROOT / "picospec" / f"{module}.py").read_text())
    found = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    found |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    found |= {f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
              and node.module in ("picospec", "picospec.beyond") for alias in node.names}
    short = lambda name: "/".join(name.split(".")[1:3]) if name.startswith("picospec.beyond.") else name.split(".")[1]  # noqa: E731
    return {short(name) for name in found if name.startswith("picospec.") and name != "picospec.beyond"}


def test_each_chapter_imports_only_the_chapters_before_it():
    """Part I: only the Part I files above it. Part II: Part I, and the Part II files above it."""
    for i, module in enumerate(LESSON):
        allowed = set(LESSON[:i]) | ASIDE | ({"gpt2", "sampling"} if module == "paper" else set())
        assert imports(module) <= allowed, f"{module}.py imports {imports(module) - allowed}"
    # The controls: the check sees imports, including `from picospec.beyond import x`.
    assert "beyond/adaptive" in imports("beyond/batch") and "beyond/loop" in imports("tools/samplers")


def test_the_tables_list_both_parts_and_part_one_stands_alone():
    files = {path.stem for path in (ROOT / "picospec").glob("*.py")} - ASIDE - {"__init__", "__main__"}
    assert set(PART_I) == files and PART_I[0] == "paper"
    assert set(PART_II) == {path.stem for path in (ROOT / "picospec" / "beyond").glob("*.py")} - {"__init__"}
    assert PART_II[0] == "loop"
    for module in PART_I:
        assert not {name for name in imports(module) if name.startswith("beyond/") or name == "tools"}, module


def test_part_one_is_an_evening_and_carries_no_hook_of_part_two():
    """At most 650 lines, and none of Part II's words or parameters."""
    text = {module: (ROOT / "picospec" / f"{module}.py").read_text() for module in PART_I}
    assert sum(len(t.splitlines()) for t in text.values()) <= 650
    hooks = re.compile(r"may_stop|target_alone|drafting|policy|beta|\b(verify|score|step|forward)=")
    for module, t in text.items():
        assert not hooks.search(t), (module, hooks.search(t))
    assert hooks.search((ROOT / "picospec" / "beyond" / "loop.py").read_text())  # the control


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
