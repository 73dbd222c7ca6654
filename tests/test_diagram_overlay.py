"""Two paths of a turn on one picture: `traces=[...]` and `fallgate diagram --trace A --trace B`.

The expected colours, numerals and classes are computed here from the traces
themselves (which (source, dest) pairs each path took), never copied from an output.
"""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs
import pytest
from fallgate.fsm.core.machine import DONE, FAILED, Declaration, declare
from fallgate.fsm.diagram import render as diagram
from fallgate.fsm.host.scripted import play
from fallgate.fsm.trace import TraceEvent, to_jsonl
from fallgate.providers.cli import gallery, main

from helpers import KEY_PREFIX, KEY_TAIL, chain

ORANGE, VIOLET = "#e8590c", "#7048e8"
needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz `dot` is not installed"
)

#: A three-model chain and two turns through it that part ways: the first retries the
#: primary (a timeout, a rebuild) then falls back once; the second falls back twice.
POLICY = chain("a", "b", "c")
RETRIED = ["transport", "transport", "rate_limited", "success"]
TWICE = ["not_found", "not_found", "success"]


def paths() -> tuple[tuple[TraceEvent, ...], tuple[TraceEvent, ...]]:
    return play(POLICY, RETRIED, random=0.5).trace, play(POLICY, TWICE, random=0.5).trace


def node_id(decl: Declaration, source: str, dest: str) -> str:
    """The drawn id of the node an edge from `source` to `dest` lands on (done and
    failed are drawn once per target: ``s_done_<target>``)."""
    if dest in (DONE, FAILED) and decl.state(source).target is not None:
        return f"s_{dest}_{decl.state(source).target}"
    return f"s_{dest}"


def taken(decl: Declaration, trace: tuple[TraceEvent, ...]) -> set[tuple[str, str]]:
    return {(f"s_{e.source}", node_id(decl, e.source, e.dest)) for e in trace}


def visited(decl: Declaration, trace: tuple[TraceEvent, ...]) -> set[str]:
    return {f"s_{trace[0].source}"} | {node_id(decl, e.source, e.dest) for e in trace}


def dot_edges(dot: str) -> dict[tuple[str, str], str]:
    """(source, dest) -> the edge's attributes, for every drawn (visible) edge."""
    out = {}
    for a, b, attributes in re.findall(r"^\s+(s_\w+) -> (s_\w+) \[(.*)\];$", dot, re.M):
        if "style=invis" not in attributes:
            out[(a, b)] = attributes
    return out


def mermaid_edges(text: str) -> dict[tuple[str, str], str]:
    return {(a, b): label for a, b, label in re.findall(r"^\s+(\S+) --> (\S+) : (.*)$", text, re.M)}


def mermaid_classes(text: str) -> dict[str, set[str]]:
    return {
        name: set(ids.split(",")) for ids, name in re.findall(r"^\s+class (\S+) (\w+)$", text, re.M)
    }


# -- the drawing ----------------------------------------------------------------------------


def test_each_path_is_drawn_in_its_colour_and_an_edge_both_took_in_both():
    decl = declare(POLICY)
    one, two = paths()
    first, second = taken(decl, one), taken(decl, two)
    assert first - second and second - first and first & second  # the premise: they part ways
    dot = diagram.to_dot(decl, traces=[one, two])
    edges = dot_edges(dot)
    for pair in first | second:
        attrs = edges[pair]
        colour = re.search(r'(?:^|, )color="([^"]*)"', attrs).group(1)
        if pair in first and pair in second:
            assert colour == f"{ORANGE}:{VIOLET}", (pair, attrs)  # two parallel lines
            assert "label=<" in attrs  # each step's numeral in its path's colour
        else:
            assert colour == (ORANGE if pair in first else VIOLET), (pair, attrs)
            assert "penwidth=3.5" in attrs
    for pair, attrs in edges.items():  # the edges neither took keep the machine's colours
        if pair not in first | second:
            assert ORANGE not in attrs and VIOLET not in attrs, pair


def test_each_state_is_marked_by_the_paths_that_visited_it():
    decl = declare(POLICY)
    one, two = paths()
    first, second = visited(decl, one), visited(decl, two)
    mm = diagram.to_mermaid(decl, traces=[one, two])
    classes = mermaid_classes(mm)
    assert classes["path1"] == first - second
    assert classes["path2"] == second - first
    assert classes["both"] == first & second
    assert "taken" not in classes
    dot = diagram.to_dot(decl, traces=[one, two])
    for ident in first | second:
        line = re.search(rf"^\s+{ident} \[(.*)\];$", dot, re.M).group(1)
        border = re.search(r'(?:^|, )color="([^"]*)"', line).group(1)
        # a state both visited: the first path's fill, the second's border
        assert border == (VIOLET if ident in second else ORANGE), ident
        assert 'fillcolor="' + ("#e5dbff" if ident not in first else "#fff3bf") in line, ident


def test_each_step_carries_its_paths_numerals_and_its_wait():
    decl = declare(chain("a"))
    # the same edge (primary -> primary_server_backoff), three jittered waits
    one = play(decl.policy, ["overloaded", "success"], random=0.1).trace
    two = play(decl.policy, ["overloaded", "overloaded", "success"], random=0.9).trace
    waits = [one[1].wait, two[1].wait, two[3].wait]
    assert None not in waits and len(set(waits)) == 3
    mm = diagram.to_mermaid(decl, traces=[one, two])
    label = mermaid_edges(mm)[("s_primary", "s_primary_server_backoff")].split("<br/>")
    heads = [x for x in label if x.endswith(" overloaded")]
    assert heads == ["② overloaded", "❷ overloaded", "❹ overloaded"]
    # each step's wait sits under its own numeral
    for head, wait in zip(heads, waits, strict=True):
        assert label[label.index(head) + 2] == f"wait {diagram.fmt_seconds(wait)}", label
    # steps that read alike share a line: the start of both paths is one line, ① ❶
    assert mermaid_edges(mm)[("s_idle", "s_primary")].startswith("①❶ start<br/>")
    assert mermaid_edges(mm)[("s_primary_server_backoff", "s_primary")].startswith("③❸❺ waited")


def test_an_edge_one_path_took_shows_only_that_paths_numerals():
    decl = declare(POLICY)
    mm = diagram.to_mermaid(decl, traces=list(paths()))
    edges = mermaid_edges(mm)
    first_only = edges[("s_primary", "s_primary_transport_backoff")]
    second_only = edges[("s_fallback_1", "s_fallback_2")]
    assert first_only.startswith("② transport") and not re.search("[❶-❿]", first_only)
    assert second_only.startswith("❸ not_found") and not re.search("[①-⑳]", second_only)
    assert edges[("s_primary", "s_fallback_1")].startswith("⑥ rate_limited<br/>")
    assert "<br/>❷ not_found<br/>" in edges[("s_primary", "s_fallback_1")]


def test_the_legend_names_each_path_and_how_it_ended():
    decl = declare(POLICY)
    one, two = paths()
    traces = [diagram.TracePath("recorded.jsonl", one), diagram.TracePath("replayed", two)]
    mm = diagram.to_mermaid(decl, traces=traces)
    note = mm[mm.index("note right of") : mm.index("end note")]
    assert f"① ② … (orange)#58; recorded.jsonl, {len(one)} steps to done" in note
    assert f"❶ ❷ … (violet)#58; replayed, {len(two)} steps to done" in note
    assert "4 requests" in note and "3 requests" in note
    assert "a state both paths visited#58; orange fill, violet border" in note
    assert "%% paths of a turn, ① recorded.jsonl vs ❶ replayed: a → b → c" in mm
    dot = diagram.to_dot(decl, traces=traces)
    legend = re.search(r"^\s+legend \[.*label=<(.*)>\];$", dot, re.M).group(1)
    assert f'<font color="{ORANGE}">① ② … (orange): recorded.jsonl' in legend
    assert f'<font color="{VIOLET}">❶ ❷ … (violet): replayed' in legend
    assert "both colours side by side" in legend


def test_markdown_compares_the_paths_then_lists_each():
    decl = declare(POLICY)
    one, two = paths()
    md = diagram.to_markdown(decl, traces=[diagram.TracePath("A|x", one), two])
    assert "```mermaid\nstateDiagram-v2\n" in md
    assert f"| A\\|x (orange) | ① ② … | {len(one)} | done |" in md
    assert f"| path 2 (violet) | ❶ ❷ … | {len(two)} | done |" in md
    assert "| ❷ | primary | not_found | fallback_1 |  |" in md
    assert "| ④ | primary | transport | primary_recovering |  |" in md


def test_a_lone_trace_in_traces_is_drawn_exactly_as_before():
    """One path, given as `trace` or as `traces=[...]`, draws the same text in every
    format, with nothing of the overlay in it; the committed single-path diagrams
    (tests/test_diagram.py) pin that text to what it was before overlays existed."""
    decl = declare(gallery.scenario_1_policy())
    trace = gallery.scenario_1_trace()
    lone = [diagram.TracePath("scenario-1.trace.jsonl", trace)]
    for draw in (diagram.to_mermaid, diagram.to_dot, diagram.to_markdown):
        text = draw(decl, trace)
        assert draw(decl, traces=lone) == text
        for overlay_only in ("❶", VIOLET, "both", "path1", "scenario-1.trace.jsonl"):
            assert overlay_only not in text, (draw.__name__, overlay_only)
    s1_md = diagram.to_markdown(
        decl,
        trace,
        title="Scenario 1: a 429 after recovery still falls back",
        intro=gallery.SCENARIO_1_INTRO,
    )
    assert s1_md == (gallery.DIAGRAMS / "scenario-1.md").read_text()


def test_a_path_that_does_not_fit_is_named_by_its_label_step_and_seq():
    decl = declare(POLICY)
    one, two = paths()
    foreign = play(chain("a", "b", "c", "d"), ["not_found"] * 3 + ["success"]).trace
    with pytest.raises(diagram.DiagramError) as e:
        diagram.to_dot(decl, traces=[one, diagram.TracePath("other.jsonl", foreign)])
    assert (e.value.path, e.value.step, e.value.seq) == ("other.jsonl", 4, foreign[3].seq)
    assert str(e.value).startswith("other.jsonl: trace step 4: state 'fallback_3' (to)")
    bogus = (*two[:-1], TraceEvent(99, 1.0, "fallback_2", "waited", "done", "Finish"))
    with pytest.raises(
        diagram.DiagramError, match="path 2: trace step 4: fallback_2 --waited--> done"
    ):
        diagram.to_mermaid(decl, traces=[one, bogus])
    with pytest.raises(diagram.DiagramError, match="at most 2"):
        diagram.to_mermaid(decl, traces=[one, two, one])
    with pytest.raises(diagram.DiagramError, match="empty: the path is empty"):
        diagram.to_markdown(decl, traces=[one, diagram.TracePath("empty", ())])
    with pytest.raises(TypeError, match="not both"):
        diagram.to_mermaid(decl, one, traces=[two])
    with pytest.raises(ValueError, match=r"TracePath\.label must be a non-empty string"):
        diagram.TracePath(" ", one)


def test_an_overlay_never_shows_a_key_and_its_ids_stay_safe():
    policy = chain("end", "state.v2", 'q"uote', keys=2)
    decl = declare(policy)
    one = play(policy, ["auth", "not_found", "success"]).trace
    two = play(policy, ["not_found", "overloaded", "success"], random=0.5).trace
    assert any(e.credential for e in one)  # the traces name credentials, by id
    traces = [diagram.TracePath('x"<y>&z', one), two]
    for text in (
        diagram.to_mermaid(decl, traces=traces),
        diagram.to_dot(decl, traces=traces),
        diagram.to_markdown(decl, traces=traces),
    ):
        assert KEY_PREFIX not in text and KEY_TAIL not in text
    mm = diagram.to_mermaid(decl, traces=traces)
    for ident in re.findall(r"^\s+class (\S+) \w+$", mm, re.M):
        for x in ident.split(","):
            assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", x), x
    dot = diagram.to_dot(decl, traces=traces)
    assert "x&quot;&lt;y&gt;&amp;z" in dot and 'x"<y>' not in dot


@needs_dot
def test_graphviz_draws_both_colours_on_a_shared_edge():
    decl = declare(POLICY)
    one, two = paths()
    svg = gallery.svg_of(diagram.to_dot(decl, traces=[one, two])).decode()
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    strokes: dict[str, set[str]] = {}
    for g in root.iter(f"{ns}g"):
        if g.get("class") == "edge":
            title = g.find(f"{ns}title").text.replace("&#45;", "-")
            strokes[title] = {p.get("stroke") for p in g.iter(f"{ns}path")}
    both = taken(decl, one) & taken(decl, two)
    for a, b in both:
        assert {ORANGE, VIOLET} <= strokes[f"{a}->{b}"], (a, b)
    for a, b in taken(decl, two) - taken(decl, one):
        assert strokes[f"{a}->{b}"] == {VIOLET}, (a, b)


# -- the command line -------------------------------------------------------------------------


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def trace_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        'max_attempts = 3\n[primary]\nprovider = "p"\nmodel = "a"\n'
        'base_url = "https://p0.test/v1"\nkey_env = "K0"\n'
        '[[fallback_providers]]\nprovider = "p"\nmodel = "b"\n'
        'base_url = "https://p1.test/v1"\nkey_env = "K1"\n'
        '[[fallback_providers]]\nprovider = "p"\nmodel = "c"\n'
        'base_url = "https://p2.test/v1"\nkey_env = "K2"\n'
    )
    from fallgate.fsm import Policy

    pol = Policy.from_toml(policy)
    a, b = tmp_path / "A.jsonl", tmp_path / "B.jsonl"
    a.write_text(to_jsonl(play(pol, RETRIED, random=0.5).trace))
    b.write_text(to_jsonl(play(pol, TWICE, random=0.5).trace))
    return policy, a, b


@pytest.mark.parametrize("fmt", ["mermaid", "markdown", "dot"])
def test_two_traces_overlay_in_every_text_format(capsys, trace_files, fmt):
    policy, a, b = trace_files
    code, out, err = run(
        capsys, "diagram", str(policy), "--trace", str(a), "--trace", str(b), "-f", fmt
    )
    assert (code, err) == (0, "")
    assert "① A.jsonl vs ❶ B.jsonl" in out  # the title names both files
    assert "❸ not_found" in out and "④ transport" in out  # each path's own edges
    if fmt == "dot":
        assert f'color="{ORANGE}:{VIOLET}"' in out
    else:
        assert "class s_fallback_2,s_done_2 path2" in out


@needs_dot
@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_two_traces_overlay_through_graphviz(capsys, trace_files, tmp_path, suffix):
    policy, a, b = trace_files
    out = tmp_path / f"overlay{suffix}"
    code, _, err = run(
        capsys,
        "diagram",
        str(policy),
        "--trace",
        f"recorded={a}",
        "--trace",
        f"replayed={b}",
        "-o",
        str(out),
    )
    assert code == 0, err
    data = out.read_bytes()
    if suffix == ".png":
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    else:
        svg = data.decode()
        assert f'stroke="{ORANGE}"' in svg and f'stroke="{VIOLET}"' in svg
        assert "① ② … (orange): recorded" in svg and "❶ ❷ … (violet): replayed" in svg


def test_the_committed_overlay_is_what_the_documented_command_draws(capsys, monkeypatch):
    monkeypatch.chdir(gallery.DIAGRAMS.parent)
    argv = gallery.OVERLAY_COMMAND.split()[1:]
    code, out, err = run(capsys, *argv)
    assert (code, err) == (0, "")
    assert out == (gallery.DIAGRAMS / "overlay.dot").read_text()
    # docs/cli.md shows the same command (drawing SVG)
    traces = " ".join(argv[argv.index("--trace") :])
    for page in ("docs/cli.md",):
        text = re.sub(r"\s*\\\n\s*", " ", (gallery.DIAGRAMS.parent / page).read_text())
        assert f"fallgate diagram diagrams/scenario-1.toml {traces} -o overlay.svg" in text, page


def test_one_trace_on_the_command_line_draws_what_it_always_drew(capsys):
    trace = str(gallery.DIAGRAMS / "scenario-1.trace.jsonl")
    policy = str(gallery.DIAGRAMS / "scenario-1.toml")
    decl = declare(gallery.scenario_1_policy())
    for fmt, draw in (("mermaid", diagram.to_mermaid), ("dot", diagram.to_dot)):
        code, out, _ = run(capsys, "diagram", policy, "--trace", trace, "-f", fmt)
        assert code == 0
        assert out == draw(decl, gallery.scenario_1_trace())


def test_too_many_traces_are_refused_with_the_reason(capsys, trace_files):
    policy, a, _ = trace_files
    code, out, err = run(capsys, "diagram", str(policy), *(["--trace", str(a)] * 3))
    assert (code, out) == (2, "")
    assert "--trace given 3 times: a diagram overlays at most 2 paths" in err
    assert "Traceback" not in err


def test_a_trace_that_does_not_fit_is_named_by_file_line_and_seq(capsys, trace_files):
    policy, a, b = trace_files
    lines = b.read_text().splitlines()
    lines.insert(0, "")  # a blank line: the file line is not the step number
    lines[2] = lines[2].replace('"dest": "fallback_1"', '"dest": "fallback_9"')
    b.write_text("\n".join(lines) + "\n")
    code, out, err = run(capsys, "diagram", str(policy), "--trace", str(a), "--trace", str(b))
    assert (code, out) == (2, "")
    assert err == (
        f"fallgate: {b}:3: trace step 2 (seq 2): state 'fallback_9' (to) is not in this "
        "policy's machine (was the trace recorded with another policy?)\n"
    )
    # an event the machine does not declare there, in the first file
    text = a.read_text().replace('"event": "waited"', '"event": "rebuilt"', 1)
    a.write_text(text)
    b.write_text(to_jsonl(paths()[1]))
    code, _, err = run(capsys, "diagram", str(policy), "--trace", str(a), "--trace", str(b))
    assert code == 2
    assert re.fullmatch(
        rf"fallgate: {re.escape(str(a))}:3: trace step 3 \(seq 3\): primary_transport_backoff "
        r"--rebuilt--> primary is not declared by this policy's machine\n",
        err,
    )


def test_a_bad_second_file_is_named(capsys, trace_files, tmp_path):
    policy, a, _ = trace_files
    missing = tmp_path / "nope.jsonl"
    code, _, err = run(capsys, "diagram", str(policy), "--trace", str(a), "--trace", str(missing))
    assert (code, err) == (2, f"fallgate: trace file not found: {missing}\n")
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"seq": 1, "time": 0, "source": "idle"}\n')
    code, _, err = run(capsys, "diagram", str(policy), "--trace", str(a), "--trace", str(junk))
    assert code == 2
    assert re.match(rf"fallgate: {re.escape(str(junk))}(:1|: trace line 1): missing", err), err


def test_labels_name_the_paths_and_the_same_file_twice_stays_two_paths(capsys, trace_files):
    policy, a, _ = trace_files
    code, out, _ = run(capsys, "diagram", str(policy), "--trace", str(a), "--trace", str(a))
    assert code == 0
    assert "① A.jsonl vs ❶ A.jsonl (2)" in out
    assert "class " in out and " path1" not in out and " path2" not in out  # all shared
    code, out, _ = run(
        capsys, "diagram", str(policy), "--trace", f"before={a}", "--trace", f"after={a}"
    )
    assert code == 0 and "① before vs ❶ after" in out


def test_drawn_on_the_at_once_policy_the_recording_is_refused_where_it_recovers(
    capsys, tmp_path, monkeypatch
):
    """docs/cli.md: draw with the policy whose machine has both paths' states; the
    at-once policy has no transport recovery, which the recorded path went through."""
    policy = tmp_path / "at-once.toml"
    policy.write_text(
        gallery.SCENARIO_1_TOML.replace(
            "max_attempts = 2", "max_attempts = 1\nrecover_transport = false"
        )
    )
    monkeypatch.chdir(gallery.DIAGRAMS.parent)
    recorded, at_once = "diagrams/scenario-1.trace.jsonl", "diagrams/scenario-1-at-once.trace.jsonl"
    code, out, err = run(capsys, "diagram", str(policy), "--trace", recorded, "--trace", at_once)
    assert (code, out) == (2, "")
    step = next(
        i for i, e in enumerate(gallery.scenario_1_trace(), 1) if e.dest == "primary_recovering"
    )
    assert err.startswith(f"fallgate: {recorded}:{step}: trace step {step} (seq {step}): ")
    assert "state 'primary_recovering' (to) is not in this policy's machine" in err
    code, out, _ = run(capsys, "diagram", str(policy), "--trace", at_once)
    assert code == 0 and "❶" not in out  # the at-once path alone fits its own policy


def test_an_overlay_in_mermaid_needs_no_graphviz(capsys, trace_files, monkeypatch):
    policy, a, b = trace_files
    monkeypatch.setenv("PATH", "")  # no `dot` to be found
    for fmt in ("mermaid", "markdown"):
        code, out, err = run(
            capsys, "diagram", str(policy), "--trace", str(a), "--trace", str(b), "-f", fmt
        )
        assert (code, err) == (0, ""), fmt
        assert "class s_fallback_2,s_done_2 path2" in out
    code, out, err = run(
        capsys, "diagram", str(policy), "--trace", str(a), "--trace", str(b), "-f", "svg"
    )
    assert (code, out) == (3, "") and "needs Graphviz's `dot`" in err


def test_a_file_of_many_turns_draws_the_turn_asked_for_and_names_its_lines(
    capsys, trace_files, tmp_path
):
    """Turns of many workers interleave in one recording: --turn picks one in every
    --trace file, and a refused step is named by its own line in the file."""
    from fallgate.fsm import Policy
    from fallgate.fsm.trace import TracedTarget, TurnHeader

    policy, _, _ = trace_files
    pol = Policy.from_toml(policy)
    targets = [TracedTarget(t.name, t.provider, t.model, str(t.base_url), ()) for t in pol.targets]
    turns = {
        "t1": play(pol, RETRIED, random=0.5).trace,
        "t2": play(pol, TWICE, random=0.5).trace,
    }
    lines = [TurnHeader(tid, 0.0, 0.0, "test", 1, targets).to_json() for tid in turns]
    for i in range(max(len(t) for t in turns.values())):  # interleaved, one of each
        for tid, trace in turns.items():
            if i < len(trace):
                lines.append(attrs.evolve(trace[i], turn=tid).to_json())
    both = tmp_path / "both.jsonl"
    both.write_text("\n".join(lines) + "\n")
    single = tmp_path / "t2.jsonl"
    single.write_text(to_jsonl(turns["t2"]))
    code, out, err = run(
        capsys, "diagram", str(policy), "--turn", "t2", "--trace", str(both), "--trace", str(single)
    )
    assert (code, err) == (0, "")
    assert "class s_idle,s_primary,s_fallback_1,s_fallback_2,s_done_2 both" in out  # t2 twice
    # t2's third transition sits on line 2 + 2*3 = 8 of the file (after the two turn lines)
    n = next(i for i, x in enumerate(lines, 1) if '"turn": "t2"' in x and '"seq": 3' in x)
    lines[n - 1] = lines[n - 1].replace('"dest": "fallback_2"', '"dest": "fallback_7"')
    both.write_text("\n".join(lines) + "\n")
    code, out, err = run(
        capsys, "diagram", str(policy), "--turn", "t2", "--trace", str(both), "--trace", str(single)
    )
    assert (code, out) == (2, "")
    assert err.startswith(f"fallgate: {both}:{n}: trace step 3 (seq 3): state 'fallback_7' (to)")


@pytest.mark.parametrize(
    ("label", "problem"),
    [("li\nne", "control characters"), ("   ", "non-empty string"), ("", "non-empty string")],
)
def test_a_label_that_would_break_the_diagram_is_a_usage_error_naming_trace(
    capsys, trace_files, label, problem
):
    """A LABEL with a newline would split a line of the Mermaid source; a blank one names
    nothing: both are refused (exit 2) naming --trace, never an internal error."""
    policy, a, b = trace_files
    code, out, err = run(
        capsys, "diagram", str(policy), "--trace", f"{label}={a}", "--trace", str(b)
    )
    assert code == 2 and out == ""
    assert "--trace" in err and problem in err and "internal error" not in err
