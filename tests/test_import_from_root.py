"""`import fallgate` from the repository root: the checkout's `fallgate/` folder sits on
sys.path first there (`''`), so it shadows whatever is installed. Its `__init__` finds
`fsm/` and `providers/` beside it; these tests prove the whole package then comes from one
tree, after an editable install (the repository's .venv) and after a wheel install into a
fresh venv, and that `python -m fallgate` is the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP = (".git", ".venv*", "build", "*.egg-info", "__pycache__", ".mypy_cache", ".hypothesis")

#: Imports the facade, the client (lazily loaded) and the engine; prints where each came from.
PROBE = """
import json, fallgate, fallgate.fsm.core.turn, fallgate.providers.openai.client
assert fallgate.Fallgate is fallgate.providers.openai.client.Fallgate
assert fallgate.fsm.core.turn.Turn is fallgate.fsm.Turn
print(json.dumps({m: __import__(m, fromlist=["_"]).__file__
                  for m in ("fallgate", "fallgate.fsm", "fallgate.providers")}))
"""


def probe(python: str | Path, cwd: Path) -> dict[str, Path]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(python), "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return {m: Path(f).resolve() for m, f in json.loads(out.stdout).items()}


def test_from_the_root_after_an_editable_install() -> None:
    where = probe(sys.executable, ROOT)
    assert where == {
        "fallgate": ROOT / "fallgate" / "__init__.py",
        "fallgate.fsm": ROOT / "fsm" / "__init__.py",
        "fallgate.providers": ROOT / "providers" / "__init__.py",
    }


def test_python_dash_m_fallgate_is_the_cli() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = [sys.executable, "-m", "fallgate"]
    version = subprocess.run([*run, "--version"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert (version.returncode, version.stdout) == (0, "fallgate 0.1.0\n")
    bad = subprocess.run([*run, "nosuch"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'nosuch'" in bad.stderr
    listed = subprocess.run([*run, "providers"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.startswith("provider ")


@pytest.mark.slow  # builds a wheel and a venv
@pytest.mark.timeout(120)
def test_from_the_root_and_elsewhere_after_a_wheel_install(tmp_path: Path) -> None:
    """A fresh venv holding only the wheel (its dependencies are the test venv's, reached
    through a .pth line, so no index is needed): from the root the checkout's tree is
    imported whole, anywhere else the installed one."""
    # built from a copy: a build in the checkout leaves build/ and *.egg-info behind
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*SKIP))
    wheels = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    [wheel] = wheels.glob("fallgate-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    # appended after the wheel's own directory (the editable finder's .pth is not run)
    (site / "zz_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    installed = site / "fallgate"
    assert probe(python, tmp_path) == {
        "fallgate": installed / "__init__.py",
        "fallgate.fsm": installed / "fsm" / "__init__.py",
        "fallgate.providers": installed / "providers" / "__init__.py",
    }
    assert probe(python, ROOT) == {
        "fallgate": ROOT / "fallgate" / "__init__.py",
        "fallgate.fsm": ROOT / "fsm" / "__init__.py",
        "fallgate.providers": ROOT / "providers" / "__init__.py",
    }
