"""Check that an installed fallgate wheel lives beside a host's own packages.

Run by ``make test-embed`` inside a fresh venv holding the fallgate wheel, a
small host distribution whose top-level packages are named ``fsm`` and
``providers`` (the names fallgate's repository uses for its own directories),
and one openai version. Plain Python, no pytest: it exits 0 when everything
holds and 1 with a message saying what broke otherwise.

It checks that

* ``fallgate``, ``fallgate.fsm`` and ``fallgate.providers`` come from the venv's
  site-packages (the wheel, not a checkout), and ``fsm`` / ``providers`` are the
  host's, before and after fallgate has run turns;
* the installed ``fallgate`` distribution owns no top-level ``fsm`` or
  ``providers`` file;
* through ``fallgate.Fallgate`` a chat completion, a ``responses.create`` and an
  ``embeddings.create`` each fall back from a primary answering 429 to a healthy
  fallback on ``fallgate.testing.FaultServer`` (the answering model and the
  requests the server recorded);
* the ``fallgate`` console script runs (``--help``, ``--version``, ``diagram`` and
  ``check`` on a small policy file, ``demo``), and the diagram generator
  (``python -m fallgate.providers.cli.gallery``) writes only where it is told.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

HOST_DIST = "fallgate-embed-host"
HOST_VALUES = {"fsm": "host-fsm", "providers": "host-providers"}
PRIMARY, FALLBACK = "primary-model", "fallback-model"
SITE = Path(sysconfig.get_paths()["purelib"]).resolve()


class CheckFailed(Exception):
    pass


def fail(message: str) -> NoReturn:
    raise CheckFailed(message)


def check(condition: object, message: str) -> None:
    if not condition:
        fail(message)


def step(message: str) -> None:
    print(f"check_embed: {message}", flush=True)


def under_site(module: Any) -> Path:
    """The module's file, which must be inside this venv's site-packages."""
    path = Path(module.__file__).resolve()
    check(
        path.is_relative_to(SITE),
        f"{module.__name__} was imported from {path}, not from this venv's site-packages "
        f"{SITE} (a checkout on sys.path or an editable install?)",
    )
    return path


# -- which packages are which -------------------------------------------------------------------


def check_layout() -> None:
    check(sys.prefix != sys.base_prefix, f"not running inside a venv ({sys.executable})")
    import fallgate.fsm  # binds `fallgate` too
    import fallgate.providers

    for mod in (fallgate, fallgate.fsm, fallgate.providers):
        under_site(mod)
    check(
        Path(fallgate.fsm.__file__).resolve() == SITE / "fallgate" / "fsm" / "__init__.py",
        f"fallgate.fsm is {fallgate.fsm.__file__}, expected site-packages/fallgate/fsm/",
    )
    check(
        Path(fallgate.providers.__file__).resolve()
        == SITE / "fallgate" / "providers" / "__init__.py",
        f"fallgate.providers is {fallgate.providers.__file__}, "
        "expected site-packages/fallgate/providers/",
    )
    check_host("after importing fallgate")

    owned = importlib.metadata.files("fallgate") or []
    check(owned, "the fallgate distribution lists no files (RECORD missing?)")
    stray = sorted(str(f) for f in owned if f.parts and f.parts[0] in HOST_VALUES)
    check(not stray, f"the fallgate distribution installed top-level files: {stray}")
    top = (importlib.metadata.distribution("fallgate").read_text("top_level.txt") or "").split()
    check(
        not set(top) & set(HOST_VALUES),
        f"fallgate's top_level.txt names {top}: it must not claim fsm or providers",
    )
    step(
        f"layout ok: fallgate {importlib.metadata.version('fallgate')} in {SITE / 'fallgate'}; "
        f"fsm and providers are {HOST_DIST}'s"
    )


def check_host(when: str) -> None:
    """`fsm` and `providers` are the host's modules (and stay so)."""
    import fallgate

    for name, value in HOST_VALUES.items():
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            fail(f"{when}: `import {name}` failed ({e}): is {HOST_DIST} installed?")
        got = getattr(mod, "HOST", None)
        check(
            got == value,
            f"{when}: `import {name}` gave {getattr(mod, '__file__', mod)!r} "
            f"(HOST={got!r}), not the host's package (HOST={value!r})",
        )
        path = under_site(mod)
        check(
            path == SITE / name / "__init__.py",
            f"{when}: `import {name}` gave {path}, expected site-packages/{name}/__init__.py",
        )
        own = getattr(fallgate, name)
        check(own is not mod, f"{when}: fallgate.{name} is the host's {name}")
        check(
            sys.modules.get(f"fallgate.{name}") is own,
            f"{when}: sys.modules['fallgate.{name}'] is not fallgate's own {name}",
        )
    files = importlib.metadata.files(HOST_DIST) or []
    check(
        {"fsm/__init__.py", "providers/__init__.py"} <= {str(f) for f in files},
        f"{when}: {HOST_DIST} does not own fsm/ and providers/: {[str(f) for f in files]}",
    )


# -- three turns through the wrapper, each falling back ------------------------------------------


def policy_for(base_url: str) -> Any:
    import fallgate

    return fallgate.Policy.from_dict(
        {
            "primary": {
                "provider": "host",
                "model": PRIMARY,
                "base_url": base_url,
                "api_key": "sk-embed-primary",
            },
            "fallback_providers": [
                {
                    "provider": "host",
                    "model": FALLBACK,
                    "base_url": base_url,
                    "api_key": "sk-embed-fallback",
                }
            ],
            "max_attempts": 2,
            "attempt_timeout": 10,
            "deadline": 30,
        },
        source="check_embed",
    )


def check_turns() -> None:
    import openai

    import fallgate
    from fallgate.testing import FaultServer

    limited = {"kind": "status", "status": 429, "headers": {"retry-after": "120"}}
    script = {
        "models": {PRIMARY: [limited], FALLBACK: [{"kind": "answer", "text": "from the fallback"}]}
    }
    calls: list[tuple[str, str, Any]] = [
        (
            "chat.completions.create",
            "/v1/chat/completions",
            lambda c: c.chat.completions.create(messages=[{"role": "user", "content": "hi"}]),
        ),
        (
            "responses.create",
            "/v1/responses",
            lambda c: c.responses.create(input="hi"),
        ),
        (
            "embeddings.create",
            "/v1/embeddings",
            lambda c: c.embeddings.create(input=["hello", "world"]),
        ),
    ]
    with FaultServer(script) as srv:
        for name, path, call in calls:
            srv.script(script)  # fresh steps and counts for each call
            # A client per call: its own health store, so the 429's cooldown on the
            # primary (Retry-After 120 s) does not make the next call skip it.
            with fallgate.Fallgate(policy_for(srv.base_url)) as client:
                reply = call(client)
            check(
                getattr(reply, "model", None) == FALLBACK,
                f"{name}: answered by model {getattr(reply, 'model', None)!r}, "
                f"expected the fallback {FALLBACK!r}",
            )
            if name == "chat.completions.create":
                text = reply.choices[0].message.content
                check(text == "from the fallback", f"{name}: got the text {text!r}")
            elif name == "responses.create":
                check(
                    reply.output_text == "from the fallback",
                    f"{name}: got the text {reply.output_text!r}",
                )
            else:
                check(
                    len(reply.data) == 2 and all(len(d.embedding) > 0 for d in reply.data),
                    f"{name}: expected two embeddings, got {reply.data!r}",
                )
            seen = [(r.model, r.path, r.kind, r.api_key) for r in srv.requests]
            want = [
                (PRIMARY, path, "status", "sk-embed-primary"),
                (FALLBACK, path, "answer", "sk-embed-fallback"),
            ]
            check(seen == want, f"{name}: the server saw {seen}, expected {want}")
            check(not srv.errors, f"{name}: the fault server recorded errors: {srv.errors}")
            step(f"{name}: 429 on {PRIMARY} -> answered by {FALLBACK} [ok]")
    step(f"turns ok with openai {openai.__version__}")


# -- the console script -------------------------------------------------------------------------

SMALL_POLICY = """\
max_attempts = 2

[primary]
provider = "host"
model = "primary-model"
base_url = "http://127.0.0.1:9/v1"
key_env = "EMBED_PRIMARY_KEY"

[[fallback_providers]]
provider = "host"
model = "fallback-model"
base_url = "http://127.0.0.1:9/v1"
key_env = "EMBED_FALLBACK_KEY"
"""


def run_cli(*args: str, cwd: Path) -> str:
    exe = Path(sys.executable).parent / "fallgate"
    check(exe.exists(), f"the console script {exe} was not installed")
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    shown = " ".join(("fallgate", *args))
    check(
        done.returncode == 0,
        f"`{shown}` exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}",
    )
    check(not done.stderr.strip(), f"`{shown}` wrote to stderr:\n{done.stderr}")
    step(f"`{shown}` ok ({time.perf_counter() - t0:.1f}s)")
    return done.stdout


def check_cli() -> None:
    with tempfile.TemporaryDirectory(prefix="fallgate-embed-") as tmp:
        cwd = Path(tmp)
        out = run_cli("--help", cwd=cwd)
        check(out.startswith("usage: fallgate"), f"`fallgate --help` printed:\n{out}")
        for command in ("demo", "diagram", "check", "serve"):
            check(command in out, f"`fallgate --help` does not list {command}:\n{out}")
        out = run_cli("--version", cwd=cwd)
        version = importlib.metadata.version("fallgate")
        check(out.strip() == f"fallgate {version}", f"`fallgate --version` printed {out!r}")
        (cwd / "policy.toml").write_text(SMALL_POLICY, encoding="utf-8")
        out = run_cli("diagram", "policy.toml", cwd=cwd)
        check(out.startswith("stateDiagram-v2"), f"`fallgate diagram` printed:\n{out[:500]}")
        out = run_cli("check", "policy.toml", cwd=cwd)
        check("holds   fallback_gate" in out, f"`fallgate check` printed:\n{out}")
        out = run_cli("demo", "--json", "--out", "demo", cwd=cwd)
        scenarios = json.loads(out)["scenarios"]
        from fallgate.providers.cli.demo import SCENARIOS

        names = [scenario["name"] for scenario in scenarios]
        check(
            names == [scenario.name for scenario in SCENARIOS]
            and all(scenario["ok"] for scenario in scenarios),
            f"`fallgate demo --json` printed:\n{out}",
        )
        check((cwd / "demo" / "retry-after.md").is_file(), "`fallgate demo` wrote no diagram")
        check_gallery(cwd)


def check_gallery(cwd: Path) -> None:
    """The diagram generator writes where it is told, and never into site-packages
    (its default, the checkout's diagrams/, does not exist in an installed wheel)."""
    inside = SITE / "fallgate" / "diagrams"
    cmd = [sys.executable, "-m", "fallgate.providers.cli.gallery"]
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    check(
        done.returncode == 2 and "DIR" in done.stderr,
        f"`python -m fallgate.providers.cli.gallery` without DIR exited {done.returncode} "
        f"(expected 2, a usage message)\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}",
    )
    check(not inside.exists(), f"the diagram generator wrote into site-packages: {inside}")
    done = subprocess.run(
        [*cmd, "out"], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    check(
        done.returncode == 0 and (cwd / "out" / "turn-machine.mmd").is_file(),
        f"`python -m fallgate.providers.cli.gallery out` exited {done.returncode}\n{done.stderr}",
    )
    step("`python -m fallgate.providers.cli.gallery [DIR]` ok")


def main() -> int:
    try:
        check_layout()
        check_turns()
        check_host("after three turns through fallgate")
        check_cli()
    except CheckFailed as e:
        print(f"check_embed: FAILED ({sys.prefix}): {e}", file=sys.stderr)
        return 1
    except Exception as e:
        import traceback

        traceback.print_exc()
        print(f"check_embed: FAILED ({sys.prefix}): {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    step(f"all checks passed in {sys.prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
