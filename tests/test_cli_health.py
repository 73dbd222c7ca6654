"""`fallgate health --store URL`: what a fleet shares (breakers, budgets, cooldowns),
from a real SQLite file or a real redis-server; `--reset TARGET` forgets one backend.

Exit statuses as for every command: 0 shown or reset, 1 the store cannot be reached,
2 a bad URL or an unknown target; never a traceback, never a password or a key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fallgate.fsm.health import records as fleet
from fallgate.fsm.health.backend import Backend, Records
from fallgate.providers.cli import health_report, main
from fallgate.providers.stores import open_backend

BASE = "http://127.0.0.1:9/v1"
PRIMARY = health_report.target_key(BASE, "glm-5.1")
LONGER = health_report.target_key(BASE, "glm-5.1-air")  # its name extends the primary's
KEY_A = fleet.credential_key((BASE, "glm-5.1"), "env:KEY_A")
KEY_B = fleet.credential_key((BASE, "glm-5.1"), "sha256:1f2e3d4c")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Backend]]:
    """(URL, a client) of a store holding an open primary whose first key cools."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'health.db'}"
    else:
        url = request.getfixturevalue("redis_server").url
    backend = open_backend(url)

    def seed(records: Records, now: float) -> Records:
        return {
            PRIMARY: {"until": now + 20, "opens": 1, "tokens": 2.5, "rr": 1},
            KEY_A: {"until": now + 10},
            KEY_B: {"until": now - 1},
            LONGER: {"fails": 1, "since": now},
        }

    backend.transact([PRIMARY, KEY_A, KEY_B, LONGER], seed, ttl=60)
    yield url, backend
    backend.close()


def test_shows_each_backend_its_breaker_budget_and_keys_by_id(capsys, store) -> None:
    url, _ = store
    code, out, _ = run(capsys, "health", "--store", url)
    assert code == 0
    lines = out.splitlines()
    [primary] = [ln for ln in lines if ln.startswith(f"glm-5.1@{BASE} ")]
    assert primary.split()[1] == "open"
    assert 18 < float(primary.split()[2]) <= 20
    assert primary.split()[-2:] == ["2.5", "1"]  # budget tokens, round-robin cursor
    [longer] = [ln for ln in lines if ln.startswith(f"glm-5.1-air@{BASE} ")]
    assert longer.split()[1] == "closed" and longer.split()[-2] == "full"
    assert any("env:KEY_A: cooling" in ln for ln in lines)
    assert any("sha256:1f2e3d4c: usable" in ln for ln in lines)


def test_json_gives_the_same_facts_as_data(capsys, store) -> None:
    url, _ = store
    code, out, _ = run(capsys, "health", "--store", url, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["store"] == url
    by_name = {t["target"]: t for t in data["targets"]}
    primary = by_name[f"glm-5.1@{BASE}"]
    assert primary["breaker"] == "open" and 18 < primary["open_seconds_left"] <= 20
    assert primary["budget_tokens"] == 2.5 and primary["opens"] == 1
    assert {c["id"]: c["cooling"] for c in primary["credentials"]} == {
        "env:KEY_A": True,
        "sha256:1f2e3d4c": False,
    }
    assert by_name[f"glm-5.1-air@{BASE}"]["failures"] == 1


def test_half_open_and_a_probe_out_are_told_apart(capsys, store) -> None:
    url, backend = store
    backend.transact(
        [PRIMARY], lambda r, now: {PRIMARY: {"until": now - 1, "opens": 2, "lease": now + 5}}, 60
    )
    data = json.loads(run(capsys, "health", "--store", url, "--json")[1])
    [primary] = [t for t in data["targets"] if t["model"] == "glm-5.1"]
    assert primary["breaker"] == "half-open (probing)" and 4 < primary["probe_seconds_left"] <= 5
    backend.transact([PRIMARY], lambda r, now: {PRIMARY: {"until": now - 1, "opens": 2}}, 60)
    data = json.loads(run(capsys, "health", "--store", url, "--json")[1])
    [primary] = [t for t in data["targets"] if t["model"] == "glm-5.1"]
    assert primary["breaker"] == "half-open"


def test_reset_forgets_exactly_one_backend_and_its_keys(capsys, store) -> None:
    url, backend = store
    code, out, _ = run(capsys, "health", "--store", url, "--reset", f"glm-5.1@{BASE}")
    assert code == 0 and "3 record(s) deleted" in out
    records, _ = backend.scan()
    assert set(records) == {LONGER}  # the model whose name extends it is untouched


def test_reset_by_a_model_name_only_one_backend_serves(capsys, store) -> None:
    url, backend = store
    code, out, _ = run(capsys, "health", "--store", url, "--reset", "glm-5.1-air", "--json")
    assert code == 0 and json.loads(out)["deleted"] == 1
    assert LONGER not in backend.scan()[0]


def test_reset_all(capsys, store) -> None:
    url, backend = store
    assert run(capsys, "health", "--store", url, "--reset", "all")[0] == 0
    assert backend.scan()[0] == {}
    code, out, _ = run(capsys, "health", "--store", url)
    assert code == 0 and "no health recorded" in out


def test_an_unknown_reset_target_is_a_usage_error_listing_the_targets(capsys, store) -> None:
    url, backend = store
    code, _, err = run(capsys, "health", "--store", url, "--reset", "gpt-4o")
    assert code == 2
    assert "'gpt-4o' is not in the store" in err and f"glm-5.1@{BASE}" in err
    assert len(backend.scan()[0]) == 4


def test_a_missing_sqlite_file_is_a_usage_error_and_is_not_created(capsys, tmp_path) -> None:
    path = tmp_path / "typo.db"
    code, _, err = run(capsys, "health", "--store", f"sqlite:///{path}")
    assert code == 2 and "no such health store file" in err
    assert not path.exists()


def test_a_bad_url_is_a_usage_error(capsys) -> None:
    code, _, err = run(capsys, "health", "--store", "memcached://:pw@host")
    assert code == 2 and "unsupported health store URL" in err and ":pw@" not in err


def test_an_unreachable_redis_fails_naming_it_without_its_password(capsys, redis_server) -> None:
    url = redis_server.url.replace("redis://", "redis://:s3cret-pass@")
    redis_server.stop()
    code, _, err = run(capsys, "health", "--store", url)
    assert code == 1
    assert "cannot reach the health store: redis://***@127.0.0.1:" in err
    assert "s3cret-pass" not in err


def test_help_says_what_is_shown_and_how_to_reset(capsys) -> None:
    code, out, _ = run(capsys, "health", "--help")
    assert code == 0
    for word in ("--store", "--reset", "--json", "sqlite:///", "redis://", "never the key"):
        assert word in out
