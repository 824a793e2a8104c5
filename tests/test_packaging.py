"""What `pip install` gives a user: a wheel that carries the bundled pair and runs it from a fresh venv."""

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_runs_the_bundled_pair_in_a_fresh_venv(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("picospec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"picospec/weights/tiny-target/model.safetensors", "picospec/weights/tiny-head/model.safetensors",
            "picospec/tools/cli/stream.py"} <= set(names)
    assert any(name.endswith("licenses/LICENSE") for name in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    # Its dependencies (jax, tokenizers, ...) come from this environment: a path in a .pth file, which
    # does not run this environment's own .pth files, so the picospec under test is the wheel's.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = subprocess.run([str(python), "-c", "import picospec; print(picospec.__file__)"], cwd=tmp_path,
                           check=True, capture_output=True, text=True).stdout
    assert where.startswith(str(venv))
    run = subprocess.run([str(bin_dir / "picospec"), "--draft", "tiny-draft", "--target", "tiny-target", "--prompt",
                          "And God said", "--n-tokens", "8"], cwd=tmp_path, capture_output=True, text=True,
                         env={"HF_HUB_OFFLINE": "1", "PICOSPEC_JIT_CACHE": "off", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("And God said") and "[speculative] 8 tokens" in run.stderr
