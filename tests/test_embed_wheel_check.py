"""tests/embed/wheel_check.py (run by `make test-embed` on the built wheel) catches
what it is for: a package left out of pyproject's list, a module missing, a
top-level fsm/ or providers/. Checked here on synthetic wheels, without a build."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wheel_check", HERE / "embed" / "wheel_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wheel_check = _load()
DIST = "fallgate-0.1.0.dist-info"
ENTRY_POINTS = "[console_scripts]\nfallgate = fallgate.providers.cli:main\n"


def _wheel(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "fallgate-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name in names:
            z.writestr(name, "")
        z.writestr(f"{DIST}/entry_points.txt", ENTRY_POINTS)
        z.writestr(f"{DIST}/RECORD", "")
    return path


@pytest.fixture
def complete() -> list[str]:
    return sorted(wheel_check.expected_files())


def test_the_checkout_has_the_packages_we_expect(complete: list[str]) -> None:
    for package in ("fallgate/fsm/checker", "fallgate/providers/testing/fault_server"):
        assert f"{package}/__init__.py" in complete
    for package in ("fallgate", "fallgate/fsm", "fallgate/providers"):
        assert f"{package}/__init__.py" in complete
        assert f"{package}/py.typed" in complete
    assert wheel_check.expected_files()["fallgate/fsm/core/turn.py"] == "fsm/core/turn.py"


def test_a_complete_wheel_passes(tmp_path: Path, complete: list[str]) -> None:
    assert wheel_check.problems(_wheel(tmp_path, complete)) == []


def test_a_subpackage_left_out_of_pyproject_fails(tmp_path: Path, complete: list[str]) -> None:
    names = [n for n in complete if not n.startswith("fallgate/providers/testing/fault_server/")]
    found = wheel_check.problems(_wheel(tmp_path, names))
    assert len(found) == 1
    expected = (
        "package fallgate.providers.testing.fault_server (from providers/testing/fault_server/)"
    )
    assert expected in found[0]
    assert "pyproject" in found[0]


def test_a_missing_module_fails(tmp_path: Path, complete: list[str]) -> None:
    names = [n for n in complete if n != "fallgate/fsm/checker/search.py"]
    assert wheel_check.problems(_wheel(tmp_path, names)) == [
        "fsm/checker/search.py is not in the wheel (expected at fallgate/fsm/checker/search.py)"
    ]


@pytest.mark.parametrize("top", ["fsm", "providers"])
def test_a_top_level_fsm_or_providers_fails(tmp_path: Path, complete: list[str], top: str) -> None:
    found = wheel_check.problems(_wheel(tmp_path, [*complete, f"{top}/__init__.py"]))
    assert found == [f"the wheel installs a top-level {top}/ (it must be fallgate/{top}/)"]


def test_a_wheel_without_the_console_script_fails(tmp_path: Path, complete: list[str]) -> None:
    path = tmp_path / "fallgate-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name in complete:
            z.writestr(name, "")
        z.writestr(f"{DIST}/RECORD", "")
    assert wheel_check.problems(path) == [
        "the wheel's entry_points.txt lacks the `fallgate` console script"
    ]
