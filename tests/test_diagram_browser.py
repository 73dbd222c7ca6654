"""The Mermaid we emit really renders: mermaid (npm) in headless Chromium.

Mermaid is picky about state ids and label text, and a diagram that does not
parse shows up on GitHub as a red "Syntax error" box. This renders every kind
of diagram we produce with the real mermaid bundle in a real browser and
checks that an SVG came out with one node per state and the path classes.

Needs Debian's `chromium` and `npm install --prefix build/mermaid mermaid`
(`.ci/run` installs both); skipped with the reason when either is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from fallgate.fsm import Policy
from fallgate.fsm.core.machine import declare
from fallgate.fsm.diagram import overview
from fallgate.fsm.diagram import render as diagram
from fallgate.fsm.host.scripted import play
from fallgate.fsm.policy.defaults import default_policy
from fallgate.providers.cli import gallery

from helpers import chain

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
MERMAID_CANDIDATES = [
    os.environ.get("FALLGATE_MERMAID_JS", ""),
    str(ROOT / "build/mermaid/node_modules/mermaid/dist/mermaid.min.js"),
    str(ROOT / "node_modules/mermaid/dist/mermaid.min.js"),
]


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _mermaid_js() -> Path | None:
    for c in MERMAID_CANDIDATES:
        if c and Path(c).is_file():
            return Path(c)
    return None


CHROMIUM = _chromium()
MERMAID = _mermaid_js()
needs_browser = pytest.mark.skipif(
    CHROMIUM is None or MERMAID is None,
    reason=(
        "needs headless Chromium (apt-get install chromium) and the mermaid npm package "
        "(npm install --prefix build/mermaid mermaid); .ci/run installs both"
    ),
)

PAGE = """<!doctype html><html><head><meta charset="utf-8">
<script src="{js}"></script></head><body><pre id="status">pending</pre><div id="out"></div>
<script>
const sources = {sources};
mermaid.initialize({{startOnLoad: false, securityLevel: "strict"}});
(async () => {{
  const results = {{}};
  for (const [name, src] of Object.entries(sources)) {{
    try {{
      const r = await mermaid.render("d_" + name, src);
      const div = document.createElement("div");
      div.id = "out_" + name;
      div.innerHTML = r.svg;
      document.getElementById("out").appendChild(div);
      results[name] = "ok";
    }} catch (e) {{
      results[name] = "error: " + (e && e.message ? e.message : String(e));
    }}
  }}
  document.getElementById("status").textContent = "DONE " + JSON.stringify(results);
}})();
</script></body></html>"""


def render(sources: dict[str, str]) -> tuple[dict[str, str], str]:
    """Render each Mermaid source; returns ({name: "ok" | "error: ..."}, the page's DOM)."""
    assert CHROMIUM is not None and MERMAID is not None
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "page.html"
        page.write_text(
            PAGE.format(js=MERMAID.as_uri(), sources=json.dumps(sources)), encoding="utf-8"
        )
        profile = Path(tmp) / "profile"
        done = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--allow-file-access-from-files",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=10000",
                "--dump-dom",
                page.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    dom = done.stdout
    m = re.search(r"DONE (\{.*?\})</pre>", dom)
    assert m, f"the page did not finish rendering (exit {done.returncode}): {done.stderr[-600:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&")), dom


def nasty_policy() -> Policy:
    names = ["end", "state.v2", "a-b/c:d", 'q"uote', "x;y#z", "graph<1>"]
    return chain(
        {"model": names[0], "key_env": "K0", "provider": "p-0"},
        *({"model": m, "key_env": f"K{i}"} for i, m in enumerate(names[1:], 1)),
        provider="p.{i}",
    )


@needs_browser
def test_every_mermaid_diagram_we_emit_renders_in_chromium():
    s1 = declare(gallery.scenario_1_policy())
    nasty = declare(nasty_policy())
    nasty_trace = play(nasty.policy, ["not_found", "auth", "overloaded", "success"]).trace
    committed = (gallery.DIAGRAMS / "turn-machine.md").read_text()
    assert (gallery.DIAGRAMS / "turn-machine.mmd").read_text() in committed
    sources = {
        "default": (gallery.DIAGRAMS / "turn-machine.mmd").read_text(),
        "scenario1": diagram.to_mermaid(s1, gallery.scenario_1_trace()),
        "nasty_path": diagram.to_mermaid(nasty, nasty_trace),
    }
    results, dom = render(sources)
    assert results == dict.fromkeys(sources, "ok"), results
    assert "Syntax error" not in dom

    for name, src in sources.items():
        block = _svg_of(dom, name)
        ids = re.findall(r'state "[^"]*" as (s_\w+)', src)
        assert ids
        for ident in ids:  # one drawn node per state
            assert re.search(rf'id="d_{name}-state-{ident}-\d+"', block), (name, ident)

    s1_svg = _svg_of(dom, "scenario1")
    taken = set(
        re.findall(r'class="node taken statediagram-state" id="d_scenario1-state-(\w+)-', s1_svg)
    )
    assert taken == {
        "s_idle",
        "s_primary",
        "s_primary_transport_backoff",
        "s_primary_recovering",
        "s_fallback_1",
        "s_done_1",
    }
    assert "⑥ rate_limited" in s1_svg
    assert "fallback_1: zai · glm-4.7" in s1_svg
    nasty_svg = _svg_of(dom, "nasty_path")
    assert "fallback_2: p.2 · a-b/c:d" in nasty_svg
    # every name shows as written (an entity is never escaped twice: no "#quot;" on screen)
    assert 'fallback_3: p.3 · q"uote' in nasty_svg
    assert "fallback_4: p.4 · x;y#z" in nasty_svg
    assert "fallback_5: p.5 · graph&lt;1&gt;" in nasty_svg


@needs_browser
def test_the_readme_overview_renders_compact_with_the_chain_in_order():
    src = (gallery.DIAGRAMS / "overview.mmd").read_text()
    assert src == overview.to_mermaid_overview(declare(default_policy()))
    nasty = overview.to_mermaid_overview(declare(nasty_policy()))
    results, dom = render({"overview": src, "nasty_overview": nasty})
    assert results == {"overview": "ok", "nasty_overview": "ok"}, results
    assert "Syntax error" not in dom
    svg = _svg_of(dom, "overview")
    for ident in re.findall(r"^\s+(s_\w+)[\[(]", src, re.M):  # one drawn node per box
        assert re.search(rf'id="d_overview-flowchart-{ident}-\d+"', svg), ident
    assert 'id="d_overview-g_0"' in svg  # the primary's group
    assert "primary: openai · gpt-4.1" in svg
    nasty_svg = _svg_of(dom, "nasty_overview")
    for shown in ("primary: p-0 · end", 'p.3 · q"uote', "p.4 · x;y#z", "p.5 · graph&lt;1&gt;"):
        assert shown in nasty_svg, shown
    # Reads at README width: its natural width is about 900 px, so GitHub scales it by
    # 0.9 or more (the whole machine is over 4000 px wide: 3 px text).
    width = float(re.search(r'<svg id="d_overview"[^>]*max-width: ([\d.]+)px', dom).group(1))
    assert width <= 1000, width

    # The chain reads top to bottom in order: primary's group, fallback_1, 2, 3, then the ends.
    def y(ident: str) -> float:
        node = rf'id="d_overview-flowchart-{ident}-\d+"'
        m = re.search(node + r'[^>]*transform="translate\(([\d.]+), ?([\d.]+)\)"', svg)
        assert m, ident
        return float(m.group(2))

    boxes = [y(f"s_fallback_{i}") for i in (1, 2, 3)]
    assert y("s_idle") < boxes[0] < boxes[1] < boxes[2] < min(y("s_done"), y("s_failed"))


def _svg_of(dom: str, name: str) -> str:
    m = re.search(rf'<div id="out_{name}">(.*?)</svg></div>', dom, re.S)
    assert m, f"no SVG for {name}"
    return m.group(1)


@needs_browser
def test_an_overlay_of_two_paths_renders_with_each_states_path_class():
    s1 = declare(gallery.scenario_1_policy())
    recorded, at_once = gallery.overlay_paths()
    nasty = declare(nasty_policy())
    one = play(nasty.policy, ["not_found", "auth", "overloaded", "success"]).trace
    two = play(nasty.policy, ["transport", "transport", "not_found", "success"], random=0.5).trace
    sources = {
        "overlay": diagram.to_mermaid(s1, traces=[recorded, at_once]),
        "nasty_overlay": diagram.to_mermaid(
            nasty, traces=[diagram.TracePath('a "b" <c>;#d', one), two]
        ),
    }
    committed = (gallery.DIAGRAMS / "overlay.md").read_text()
    assert sources["overlay"] in committed  # the committed page embeds what renders here
    results, dom = render(sources)
    assert results == dict.fromkeys(sources, "ok"), results
    assert "Syntax error" not in dom

    svg = _svg_of(dom, "overlay")
    drawn: dict[str, set[str]] = {}
    for cls, ident in re.findall(
        r'class="node (path1|path2|both) statediagram-state" id="d_overlay-state-(\w+)-', svg
    ):
        drawn.setdefault(cls, set()).add(ident)
    # the recorded path alone went through the backoff and the rebuild; both started at
    # the primary and ended on the fallback
    assert drawn == {
        "path1": {"s_primary_transport_backoff", "s_primary_recovering"},
        "both": {"s_idle", "s_primary", "s_fallback_1", "s_done_1"},
    }
    assert "①❶ start" in svg and "⑥ rate_limited" in svg and "❷ transport" in svg
    assert "recorded, 7 steps to done" in svg and "at-once, 3 steps to done" in svg
    nasty_svg = _svg_of(dom, "nasty_overlay")
    assert "a &quot;b&quot; &lt;c&gt;;#d" in nasty_svg or 'a "b" &lt;c&gt;;#d' in nasty_svg
    assert re.search(r'class="node path2 statediagram-state"', nasty_svg)
