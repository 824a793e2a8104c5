"""What a user sees does not change by accident: the tokens and decisions of a set of CLI runs on the
bundled pair, against a record kept in tests/data/cli_record.json.

The record holds, for each run, every row's tokens and every iteration's drafted tokens, accepted
count, k and bonus flag. Rewriting the code must leave all of them as they are; a change meant to
alter what users see rewrites the record on purpose: `python tests/test_cli_record.py`.
"""

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import DATA  # noqa: E402
from test_cli import adds_up  # noqa: E402

from picospec.tools import cli  # noqa: E402
from picospec.tools.autotune import laps  # noqa: E402

RECORD = DATA / "cli_record.json"
PAIR = ["--draft", "tiny-draft", "--target", "tiny-target", "--n-tokens", "24", "--K", "4"]
PROMPT = ["--prompt", "And God said"]
REPEATS = ["--prompt", "And God said, Let there be light: and there was light. And God saw the light"]
SAMPLED = ["--temperature", "0.8", "--seed", "3"]
RUNS = {
    "match greedy": ["--verify", "match"],
    "token greedy": ["--verify", "token"],
    "block greedy": ["--verify", "block"],
    "match sampled": ["--verify", "match", *SAMPLED],
    "token sampled": ["--verify", "token", *SAMPLED],
    "block sampled": ["--verify", "block", *SAMPLED],
    "two drafts, token": ["--drafts", "2", *SAMPLED],
    "two drafts, match": ["--drafts", "2", "--verify", "match", *SAMPLED],
    "ngram": ["--draft", "ngram", *REPEATS, *SAMPLED],
    "ngram greedy": ["--draft", "ngram", *REPEATS],
    "top-k": ["--top-k", "20", *SAMPLED],
    "top-p": ["--top-p", "0.9", *SAMPLED],
    "batch of 3": [*PROMPT, "--prompt", "In the beginning", "--prompt", "And the LORD spake unto Moses", *SAMPLED],
    "auto greedy": ["--K", "auto"],
    "auto sampled, confidence": ["--K", "auto", "--confidence", "0.2", *SAMPLED],
    "autoregressive": ["--mode", "autoregressive", *SAMPLED],
}
FAST = []  # every recorded run is in -m slow (the fast suite runs the CLI in test_cli, test_batch, test_several, ...)
COSTS = {"v": [1.0, 1.5, 1.625, 1.75, 2.0, 2.25, 2.5, 2.75], "prefill": 0.5, "spread": 0.0, "ms": 3.0, "rounds": 0}
# drafting k = 0..7 (the bundled pair's shape on a CPU), the draft's prefill: auto's choices, fixed


def run(name: str) -> list[dict]:
    """One run of the CLI: per row, its tokens and its iterations' decisions."""
    flags = RUNS[name]
    argv = PAIR + ([] if "--prompt" in flags else PROMPT) + flags + ["--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0, name
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    rows = sorted(lines[:-1], key=lambda r: r["row"]) if len(lines) > 1 else lines
    for r in rows if "auto" in flags else []:  # --K auto: each call its own k
        adds_up(r["stats"], r["steps"])
        if len(rows) == 1:  # and what --json says it chose is what it did
            ks = [s["k"] for s in r["steps"]]
            assert r["stats"]["auto"]["k_chosen"] == {str(k): ks.count(k) for k in sorted(set(ks))}
    return [{"tokens": r["tokens"],
             "steps": [[s.get("drafted", []), s.get("accepted", 0), s.get("k", 0), s.get("bonus", False)]
                       for s in r["steps"]]} for r in rows]


@pytest.fixture
def fixed_costs(monkeypatch):
    asked = []  # what the costs were asked for
    monkeypatch.setattr(laps, "costs", lambda *args: asked.append(args) or COSTS)
    return asked


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in RUNS])
def test_the_cli_gives_the_recorded_tokens_and_decisions(fixed_costs, name):
    assert run(name) == json.loads(RECORD.read_text())[name]
    assert len(fixed_costs) == ("auto" in RUNS[name])  # timed through the stream's own programs


def test_the_record_is_not_trivial():  # the control: runs that differ in what they ask differ in the record
    record = json.loads(RECORD.read_text())
    assert record["token greedy"][0]["tokens"] == record["block greedy"][0]["tokens"]  # greedy is greedy
    assert record["token sampled"] != record["block sampled"] != record["match sampled"]
    assert len(record["batch of 3"]) == 3 and all(len(r["tokens"]) == 24 for r in record["batch of 3"])


if __name__ == "__main__":
    laps.costs = lambda *args: COSTS
    RECORD.write_text(json.dumps({name: run(name) for name in RUNS}, indent=None) + "\n")
    print(f"wrote {RECORD}")
