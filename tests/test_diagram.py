"""Diagrams are read off the declaration: the user's chain, guards, a turn's path.

The committed diagrams under diagrams/ are regenerated in memory here; a stale
file fails the test (run `make diagrams`).
"""

from __future__ import annotations

import re
import shutil

import pytest
from fallgate.fsm import Policy
from fallgate.fsm.core.machine import declare
from fallgate.fsm.diagram import overview
from fallgate.fsm.diagram import render as diagram
from fallgate.fsm.diagram.style import mermaid_text
from fallgate.fsm.host.scripted import play
from fallgate.fsm.kinds import Phase
from fallgate.fsm.policy.defaults import default_policy
from fallgate.fsm.trace import TraceEvent, from_jsonl
from fallgate.providers.cli import gallery

from helpers import KEY_PREFIX, KEY_TAIL, chain


def mermaid_ids(text: str) -> set[str]:
    return set(re.findall(r"\bas (\S+)", text)) | set(re.findall(r"(\S+) --> (\S+)", text)[0])


# -- what the picture shows ---------------------------------------------------------------------


def test_every_state_of_the_users_chain_is_drawn_grouped_under_its_provider_and_model():
    decl = declare(chain("m.one", "m-two", "end", provider="prov-{i}"))
    text = diagram.to_mermaid(decl)
    for s in decl.states:  # every state is drawn, the cooling ones too: a refused
        assert f'"{s.name}"' in text  # attempt waits there for the breaker's verdict
    assert "wait in the soonest one's _cooling state" in text
    assert 'state "primary: prov-0 · m.one" as g_0 {' in text
    assert 'state "fallback_2: prov-2 · end" as g_2 {' in text
    dot = diagram.to_dot(decl)
    assert 'label="fallback_1: prov-1 · m-two"' in dot
    assert dot.count("subgraph cluster_t") == 3


def test_mermaid_ids_are_safe_whatever_the_names():
    decl = declare(chain("end", "state.v2", "a-b"))
    text = diagram.to_mermaid(decl)
    ids = re.findall(r'state "[^"]*" as (\S+)', text)
    assert ids, text
    for ident in ids:
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", ident), ident
        assert ident not in {"end", "state", "note", "class", "classDef", "direction"}
    for src, dst in re.findall(r"^\s+(\S+) --> (\S+) :", text, re.M):
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", src) and re.fullmatch(
            r"[A-Za-z][A-Za-z0-9_]*", dst
        )


def test_triggers_between_the_same_two_states_collapse_into_one_edge_with_guards():
    decl = declare(chain("a", "b", keys=2))  # keys to rotate to
    text = diagram.to_mermaid(decl)
    loops = re.findall(r"^\s+s_primary --> s_primary : (.*)$", text, re.M)
    assert len(loops) == 1
    assert "rate_limited, quota, auth" in loops[0]
    reserve = "then ≤60s more leaves the next target an attempt"
    assert f"[another key free, rotations #lt; keys-1, elapsed #lt; 180s#59; {reserve}]" in loops[0]
    edges = re.findall(r"^\s+s_primary --> s_primary_transport_backoff : (.*)$", text, re.M)
    assert edges == [
        "transport<br/>[attempts #lt; 3, not recovered, backoff ≤8s fits the 180s deadline, "
        "not probing#59; streak #lt; 2 and a retry token (of 10) left, or a client-side fault"
        f"#59; {reserve}]"
    ]
    # one edge per (source, dest) pair, never two
    pairs = re.findall(r"^\s+(\S+) --> (\S+) :", text, re.M)
    assert len(pairs) == len(set(pairs))


def test_last_resort_edges_say_otherwise_and_the_fallback_set_is_named_once():
    text = diagram.to_dot(declare(chain("a", "b")))
    assert "otherwise: fault*" in text
    assert "content_filtered, bad_request" in text
    assert "fault* = transport, rate_limited, quota, overloaded, auth,\\l" in text
    assert "[next eligible = fallback_1, elapsed < 180s]" in text


def test_cancelled_is_drawn_once_not_from_every_state():
    decl = declare(chain("a", "b", "c"))
    cancels = [t for t in decl.transitions if t.trigger == "cancelled"]
    assert len(cancels) > 10
    mm = diagram.to_mermaid(decl)
    assert mm.count("s_aborted :") == 1
    assert "cancelled (from any running state)" in mm
    dot = diagram.to_dot(decl)
    assert dot.count("-> s_aborted") == 1
    assert "ltail=cluster_running" in dot


def test_a_diagram_never_shows_a_key():
    decl = declare(chain("a", "b"))
    for text in (diagram.to_mermaid(decl), diagram.to_dot(decl), diagram.to_markdown(decl)):
        assert KEY_PREFIX not in text
        assert KEY_TAIL not in text


# -- a turn's path ------------------------------------------------------------------------------


def test_a_trace_highlights_the_states_visited_and_numbers_the_edges_taken():
    pol = chain("a", "b")
    played = play(pol, ["transport", "transport", "rate_limited", "success"], random=0.5)
    decl = declare(pol)
    mm = diagram.to_mermaid(decl, played.trace)
    taken = re.search(r"^\s+class (\S+) taken$", mm, re.M)
    assert taken is not None
    assert taken.group(1).split(",") == [
        "s_idle",
        "s_primary",
        "s_primary_transport_backoff",
        "s_primary_recovering",
        "s_fallback_1",
        "s_done_1",
    ]
    assert (
        "s_primary --> s_fallback_1 : ⑥ rate_limited<br/>"
        "[next eligible = fallback_1, elapsed #lt; 180s]" in mm
    )
    assert "s_primary_transport_backoff --> s_primary : ③ waited" in mm
    dot = diagram.to_dot(decl, played.trace)
    taken_edges = re.findall(
        r"^\s+(\S+) -> (\S+) \[label=\"([^\"]*)\", color=\"#e8590c\"", dot, re.M
    )
    assert [(a, b) for a, b, _ in taken_edges] == [
        ("s_idle", "s_primary"),
        ("s_primary", "s_primary_transport_backoff"),
        ("s_primary", "s_primary_recovering"),
        ("s_primary", "s_fallback_1"),
        ("s_primary_transport_backoff", "s_primary"),
        ("s_primary_recovering", "s_primary"),
        ("s_fallback_1", "s_done_1"),
    ]
    assert "penwidth=3.5" in dot
    assert re.search(r's_primary \[label="primary".*xlabel="1,3,5"', dot)


def test_a_trace_from_another_policy_is_refused_with_the_step_named():
    three = play(chain("a", "b", "c"), ["not_found", "not_found", "success"]).trace
    with pytest.raises(diagram.DiagramError, match=r"trace step 3: state 'fallback_2'"):
        diagram.to_mermaid(declare(chain("a", "b")), three)
    bogus = [TraceEvent(1, 0.0, "idle", "success", "done", "Finish")]
    with pytest.raises(diagram.DiagramError, match="idle --success--> done is not declared"):
        diagram.to_dot(declare(chain("a")), bogus)


def test_markdown_has_a_mermaid_fence_and_the_step_table():
    pol = chain("a")
    played = play(pol, ["overloaded", "success"], random=0.5)
    md = diagram.to_markdown(declare(pol), played.trace, title="a turn")
    assert md.startswith("# a turn\n")
    assert "```mermaid\nstateDiagram-v2\n" in md
    assert "| 2 | primary | overloaded | primary_server_backoff | " in md


# -- the committed diagrams ---------------------------------------------------------------------


def test_scenario_1_trace_is_the_spec_path():
    trace = gallery.scenario_1_trace()
    assert [e.dest for e in trace] == [
        "primary",
        "primary_transport_backoff",
        "primary",
        "primary_recovering",
        "primary",
        "fallback_1",
        "done",
    ]
    assert [e.model for e in trace if e.action == "Attempt"] == [
        "glm-5.1",
        "glm-5.1",
        "glm-5.1",
        "glm-4.7",
    ]
    assert gallery.scenario_1_policy() == Policy.from_toml(gallery.DIAGRAMS / "scenario-1.toml")


def test_committed_diagrams_are_fresh():
    stale = []
    for name, text in gallery.sources().items():
        path = gallery.DIAGRAMS / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    assert not stale, f"stale diagrams (run `make diagrams`): {stale}"
    committed = from_jsonl((gallery.DIAGRAMS / "scenario-1.trace.jsonl").read_text())
    assert tuple(committed) == gallery.scenario_1_trace()


def test_committed_svgs_exist_for_every_dot_file():
    for dot in gallery.DIAGRAMS.glob("*.dot"):
        svg = dot.with_suffix(".svg")
        assert svg.exists(), f"{svg.name} missing (run `make diagrams` with Graphviz installed)"
        assert svg.read_text().lstrip().startswith("<?xml")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_committed_svgs_are_drawn_from_the_committed_dot_sources():
    # dot's SVG differs between Graphviz versions, so compare what it draws: every
    # node and edge title of a fresh rendering appears in the committed SVG.
    for dot in gallery.DIAGRAMS.glob("*.dot"):
        fresh = gallery.svg_of(dot.read_text()).decode()
        committed = dot.with_suffix(".svg").read_text()
        titles = set(re.findall(r"<title>([^<]*)</title>", fresh))
        assert titles == set(re.findall(r"<title>([^<]*)</title>", committed)), dot.name
        labels = set(re.findall(r">([^<>]+)</text>", fresh))
        assert labels == set(re.findall(r">([^<>]+)</text>", committed)), dot.name


def test_the_default_policy_has_three_fallbacks_with_two_env_keys_each():
    pol = default_policy()
    assert len(pol.fallbacks) == 3
    assert pol.max_attempts == 3
    for t in pol.targets:
        assert len(t.credentials) == 2
        assert all(c.env and c.key is None for c in t.credentials)


def test_a_trace_recorded_with_other_models_is_refused():
    trace = play(chain("a", "b"), ["not_found", "success"]).trace
    with pytest.raises(diagram.DiagramError, match=r"trace step 1: target primary is model 'a'"):
        diagram.to_mermaid(declare(chain("x", "y")), trace)


@pytest.mark.parametrize(
    ("page", "embedded"), [("docs/cli.md", "turn-machine.mmd"), ("README.md", "overview.mmd")]
)
def test_the_docs_embed_the_current_default_diagram(page, embedded):
    doc = (gallery.DIAGRAMS.parent / page).read_text()
    fence = re.search(r"```mermaid\n(.*?)```", doc, re.S)
    assert fence is not None
    assert fence.group(1) == (gallery.DIAGRAMS / embedded).read_text()


def test_the_readme_links_the_whole_machine_next_to_the_overview():
    readme = (gallery.DIAGRAMS.parent / "README.md").read_text()
    section = readme[readme.index("## The machine") : readme.index("```mermaid")]
    for link in ("diagrams/turn-machine.svg", "diagrams/turn-machine.md"):
        assert f"]({link})" in section, link
        assert (gallery.DIAGRAMS.parent / link).exists()


# -- the compact overview -----------------------------------------------------------------------


def _overview_nodes(text: str) -> list[str]:
    """Ids of the overview's node definitions, in order (subgraph and legend excluded)."""
    return re.findall(r"^\s+(s_\w+)[\[(]", text, re.M)


def _overview_edges(text: str) -> list[tuple[str, str, str]]:
    return re.findall(r"^\s+(\S+) <?-->\|\"([^\"]*)\"\| (\S+)$", text, re.M)


def test_the_overview_draws_the_primary_in_full_and_each_other_target_as_one_box_in_order():
    decl = declare(chain("m.one", "m-two", "end", "four", provider="prov-{i}", keys=2))
    text = overview.to_mermaid_overview(decl)
    nodes = _overview_nodes(text)
    primary = [s.name for s in decl.states if s.target == 0]
    assert [n for n in nodes if n.startswith("s_primary")] == [f"s_{n}" for n in primary]
    # calling, transport backoff, recovering, rate limited, server, and cooling (the wait
    # for its breaker's verdict)
    assert len(primary) == 6 and decl.state(primary[-1]).phase is Phase.COOLING
    boxes = [n for n in nodes if n.startswith("s_fallback")]
    assert boxes == ["s_fallback_1", "s_fallback_2", "s_fallback_3"]  # no phases, chain order
    assert "fallback_1_" not in text
    ends = {x for a, _, b in _overview_edges(text) for x in (a, b)}
    assert ends <= {*nodes, "g_0"}  # every edge joins drawn nodes
    assert 'subgraph g_0 ["primary: prov-0 · m.one"]' in text
    assert 's_fallback_2["fallback_2<br/>prov-2 · end"]' in text
    edges = {(a, b): label for a, label, b in _overview_edges(text)}
    # the chain, one step at a time (a fall-back further down is summarised by the guard)
    assert ("g_0", "s_fallback_1") in edges and "[next eligible target]" in edges[
        ("g_0", "s_fallback_1")
    ]
    assert ("s_fallback_1", "s_fallback_2") in edges and ("s_fallback_2", "s_fallback_3") in edges
    assert not any(b in {"s_fallback_2", "s_fallback_3"} for a, b in edges if a == "g_0")
    for src in ("g_0", *boxes):
        assert edges[(src, "s_done")] == "success"
        assert (src, "s_failed") in edges
    assert ("s_fallback_3", "s_fallback_1") not in edges  # never back up the chain


def test_the_overview_labels_are_read_off_the_declaration():
    policy = chain("a", "b", keys=2, max_attempts=4, retry_after_cap=12, deadline=90)
    decl = declare(policy)
    text = overview.to_mermaid_overview(decl)
    flat = text.replace("<br/>", " ")
    # the primary's own edges, each with the guard the declaration gives it
    for t in decl.edges():
        src, dst = decl.state(t.source), decl.state(t.dest)
        if src.target == 0 and dst.target == 0 and t.guard is not None:
            words = mermaid_text(t.guard.label(policy, t.arg))
            assert words in flat, words
    assert "attempts #lt; 4, wait ≤ 12s (spread within backoff ≤8s), fits the 90s deadline" in flat
    # an edge and its way back are one double-headed arrow; rotation is written in its state
    # (the way back is guarded too: no attempt after the deadline)
    back = (
        r"s_primary <-->\|\"transport .*← waited \[elapsed #lt; 90s\]\"\| "
        r"s_primary_transport_backoff"
    )
    assert re.search(back, flat)
    rebuilt = (
        r"s_primary <-->\|\"transport .*← rebuilt \[elapsed #lt; 90s\]\"\| s_primary_recovering"
    )
    assert re.search(rebuilt, flat)
    assert "s_primary --> s_primary" not in text
    assert "↻ rate_limited, quota, auth" in flat and "call with the next key" in flat
    assert "fault* = transport, rate_limited, quota, overloaded, auth, not_found," in flat
    assert "each fallback has the same phases as primary" in flat


def test_the_overview_follows_the_policy():
    lean = overview.to_mermaid_overview(declare(chain("a", "b", recover_transport=False)))
    assert "s_primary_recovering" not in lean and "rebuild_failed" not in lean
    streams = declare(chain({"model": "a", "assistant_prefix": True}, "b"))
    assert 's_primary_continuing["primary_continuing<br/>↻ stream_interrupted' in (
        overview.to_mermaid_overview(streams)
    )
    solo = overview.to_mermaid_overview(declare(chain("only")))
    assert "s_fallback" not in solo and "each fallback" not in solo
    assert 'g_0 -->|"success"| s_done' in solo
    # no fault falls back: the only trigger left on the edge to the fallback is an attempt
    # the health store refused
    kinds = ("transport", "rate_limited", "quota", "overloaded", "auth", "not_found")
    stay = chain("a", "b", rules={k: {"fall_back": False} for k in (*kinds, "context_too_long")})
    text = overview.to_mermaid_overview(declare(stay))
    assert 'g_0 -->|"denied<br/>[next eligible target]"| s_fallback_1' in text


def test_the_overview_ids_are_safe_and_it_never_shows_a_key():
    decl = declare(chain("end", "state.v2", "a-b/c:d", 'q"uote', keys=2))
    text = overview.to_mermaid_overview(decl)
    assert KEY_PREFIX not in text and KEY_TAIL not in text
    for a, _, b in _overview_edges(text):
        for ident in (a, b):
            assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", ident), ident
    assert 'q"uote' not in text  # a quote would end the label early


def test_mermaid_label_escapes_are_one_pass():
    # '"' -> '#quot;' must not have its ';' escaped again (it showed as "#quot;")
    assert mermaid_text('q"u;o#t<1>%{x}') == "q#quot;u#59;o#35;t#lt;1#gt;#37;#123;x#125;"
    # a name that holds entity-like text shows as written: "&lt;" is not read as "<"
    assert mermaid_text("R&D &lt;") == "R#38;D #38;lt#59;"
