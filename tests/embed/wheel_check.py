"""Check what a built fallgate wheel contains against the repository's packages.

    python tests/embed/wheel_check.py build/wheel/fallgate-0.1.0-py3-none-any.whl

The repository keeps the engine in ``fsm/`` and the network code in
``providers/``; the wheel must hold them as ``fallgate/fsm/`` and
``fallgate/providers/`` (pyproject's ``package-dir``) and nothing at the top
of site-packages but ``fallgate/`` and its ``.dist-info``. Every package of the
checkout (a directory with an ``__init__.py``) must be in the wheel with all of
its modules and its ``py.typed``: a subpackage left out of pyproject's
``packages`` list fails here. Exit status 0 when the wheel is complete, 1 with
the list of problems otherwise.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

#: Repository directory -> where its files go in the wheel.
PACKAGE_DIRS = {"fallgate": "fallgate", "fsm": "fallgate/fsm", "providers": "fallgate/providers"}
#: Files of a package directory that must be shipped.
SHIPPED_SUFFIXES = (".py",)
SHIPPED_NAMES = ("py.typed",)
REPO = Path(__file__).resolve().parents[2]


def expected_files(repo: Path = REPO) -> dict[str, str]:
    """Every file the wheel must hold, by wheel path -> the checkout path it comes from."""
    want: dict[str, str] = {}
    for src, dest in PACKAGE_DIRS.items():
        for init in sorted((repo / src).rglob("__init__.py")):
            package = init.parent
            if "__pycache__" in package.parts:
                continue
            rel = package.relative_to(repo / src)
            for f in sorted(package.iterdir()):
                if f.is_file() and (f.suffix in SHIPPED_SUFFIXES or f.name in SHIPPED_NAMES):
                    inside = "/".join((dest, *rel.parts, f.name))
                    want[inside] = str(f.relative_to(repo))
    return want


def problems(wheel: Path, repo: Path = REPO) -> list[str]:
    """What is wrong with the wheel (empty: nothing)."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist_info = sorted({n.split("/", 1)[0] for n in names if ".dist-info/" in n})
        entry_points = ""
        if len(dist_info) == 1 and f"{dist_info[0]}/entry_points.txt" in names:
            entry_points = z.read(f"{dist_info[0]}/entry_points.txt").decode()
    found: list[str] = []
    tops = sorted({n.split("/", 1)[0] for n in names})
    for top in tops:
        if top in ("fsm", "providers"):
            found.append(f"the wheel installs a top-level {top}/ (it must be fallgate/{top}/)")
        elif top != "fallgate" and not top.endswith(".dist-info"):
            found.append(f"the wheel installs an unexpected top-level entry: {top}")
    if len(dist_info) != 1:
        found.append(f"expected one .dist-info directory, found {dist_info}")
    want = expected_files(repo)
    if not want:
        found.append(f"no packages found under {repo} (wrong checkout?)")
    packages = sorted({w.rsplit("/", 1)[0] for w in want})
    for package in packages:
        if f"{package}/__init__.py" not in names:
            src = want[f"{package}/__init__.py"].rsplit("/", 1)[0]
            found.append(
                f"package {package.replace('/', '.')} (from {src}/) is missing from the wheel: "
                "is it in pyproject's [tool.setuptools] packages?"
            )
    missing_packages = {p for p in packages if f"{p}/__init__.py" not in names}
    for inside, src in want.items():
        if inside not in names and inside.rsplit("/", 1)[0] not in missing_packages:
            found.append(f"{src} is not in the wheel (expected at {inside})")
    if "fallgate = fallgate.providers.cli:main" not in entry_points:
        found.append("the wheel's entry_points.txt lacks the `fallgate` console script")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: wheel_check.py WHEEL", file=sys.stderr)
        return 2
    wheel = Path(argv[0])
    found = problems(wheel)
    if found:
        n = len(found)
        print(
            f"wheel_check: {wheel.name} is not right ({n} problem{'s' if n > 1 else ''}):",
            file=sys.stderr,
        )
        for p in found:
            print(f"  {p}", file=sys.stderr)
        return 1
    with zipfile.ZipFile(wheel) as z:
        n = len(z.namelist())
    print(
        f"wheel_check: {wheel.name} ok: {len(expected_files())} package files under fallgate/ "
        f"({n} entries), no top-level fsm/ or providers/"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
