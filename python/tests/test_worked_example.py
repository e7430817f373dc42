"""The README's worked example: its commands, run at the reduced size the README names, print the
decoding table that the README shows for that size.

The commands are read from the README itself (the first ``sh`` block of "A 10-minute worked
example"), so the test and the page cannot drift apart; only the sizes are reduced (``--steps``,
``--n``) and the output directory moved. The expected table is the README's block that follows the
words "At the test's reduced size"."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from conftest import ROOT

README = ROOT / "README.md"
#: The reduced size, as the README states it.
REDUCED = {"--steps": "2000", "--n": "512"}
#: Differences allowed between the README's numbers and a run's: the last digit of a rounded value,
#: and the CPU's vector width (AVX2 / AVX-512 matrix products round differently in the last bits,
#: which 2,000 training steps can carry into the third decimal).
TOL = 0.03


def _section() -> str:
    text = README.read_text()
    start = text.index("## A 10-minute worked example")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _commands(section: str) -> list[list[str]]:
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    joined = re.sub(r"\\\n\s*", " ", block)
    cmds = []
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("hyperlens "):
            cmds.append(shlex.split(line)[1:])
    return cmds


def _table(text: str) -> dict[str, list[float]]:
    """The rows of `hyperlens analyze`'s printed table: layer -> accuracy, balanced, majority,
    shuffled."""
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and (parts[0].isdigit() or parts[0] == "all"):
            try:
                rows[parts[0]] = [float(v) for v in parts[1:5]]
            except ValueError:
                continue
    return rows


def _expected(section: str) -> dict[str, list[float]]:
    at = section.index("At the test's reduced size")
    block = re.search(r"```text\n(.*?)```", section[at:], re.S).group(1)
    return _table(block)


def test_the_readme_example_prints_the_table_the_readme_shows(cli, tmp_path):
    section = _section()
    cmds = _commands(section)
    assert [c[0] for c in cmds] == ["train", "eval", "probe", "probe", "analyze"], cmds
    assert all(f"{k} {v}" in section for k, v in REDUCED.items()), "the README states the reduced size"
    printed = ""
    for args in cmds:
        args = [a.replace("runs/demo", str(tmp_path)) for a in args]
        for flag, value in REDUCED.items():
            if flag in args:
                args[args.index(flag) + 1] = value
        r = subprocess.run([str(cli), *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"hyperlens {' '.join(args)}:\n{r.stderr[-3000:]}"
        printed = r.stdout
    got, want = _table(printed), _expected(section)
    assert set(want) == {"0", "1", "all"} and set(got) == set(want), (got, want)
    for layer in want:
        assert got[layer] == pytest.approx(want[layer], abs=TOL), (layer, got[layer], want[layer], printed)
    # what the example is for: the codes of layer 1 decode the rule on held-out combinations above
    # the majority baseline and the shuffled-label control, at this size already
    acc, _, majority, shuffled = got["1"]
    assert acc > majority + 0.05 and acc > shuffled + 0.05, printed
