"""Record the incident of docs/replay.md's worked example as examples/replay/incident.jsonl.

Starts the fault server on 127.0.0.1:8931 and runs two turns through fallgate with the
real `openai` SDK under waiting.toml (``prefer_waiting = true``), recording both:

1. the primary answers 429 with Retry-After 20: the policy waits it out (about 21 s of
   real time), then the primary answers;
2. two seconds later the primary answers 429 with Retry-After 120, more than the 30 s
   the policy waits: the fallback answers.

    python examples/replay/record.py            # writes incident.jsonl next to this file
    fallgate replay examples/replay/incident.jsonl --policy examples/replay/default.toml
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import fallgate
from fallgate.testing import FaultServer

HERE = Path(__file__).resolve().parent
SCRIPT = {
    "models": {
        "glm-5.1": [
            {"kind": "status", "status": 429, "headers": {"retry-after": "20"}, "delay": 0.05},
            {"kind": "answer", "text": "answered by glm-5.1", "delay": 0.4},
            {"kind": "status", "status": 429, "headers": {"retry-after": "120"}, "delay": 0.05},
        ],
        "glm-4.7": [{"kind": "answer", "text": "answered by glm-4.7", "delay": 0.4}],
    }
}


def main(out: Path = HERE / "incident.jsonl") -> None:
    out.unlink(missing_ok=True)
    policy = fallgate.Policy.from_toml(HERE / "waiting.toml")
    with FaultServer(SCRIPT, port=8931), fallgate.Fallgate(policy) as client:
        with fallgate.record_traces(out):
            for n in (1, 2):
                reply = client.chat.completions.create(
                    messages=[{"role": "user", "content": f"turn {n}"}]
                )
                print(f"turn {n}: {reply.choices[0].message.content}", file=sys.stderr)
                time.sleep(2)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
