"""Prompt sets for language models: build, validate, load/save, the generators, and the same file
as the CLI's ``hyperlens tasks prompts``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hyperlens as hl
from conftest import run_cli


def _prompt(*segments, **rest):
    return {"segments": [{"text": t, "role": r} for t, r in segments], **rest}


MINE = [
    _prompt(("Q:", "separator"), (" 3", "query_input"), ("\nA:", "separator"),
            labels={"operation": "next", "domain": "digits"}, answer=" 4", split="train"),
    _prompt(("Q:", "separator"), (" c", "query_input"), ("\nA:", "separator"),
            labels={"operation": "previous", "domain": "lower"}, answer=" b", split="test"),
    _prompt(("The ", "context"), ("cat", "key"), (" héllo\n", "query"), labels={"operation": "next"}),
]


def test_built_prompts_round_trip_through_a_file(tmp_path):
    ps = hl.tasks.prompts(MINE)
    assert len(ps) == 3
    assert ps[0] == MINE[0] and ps[2] == MINE[2] and ps[-1] == MINE[2]
    assert list(ps) == MINE
    assert ps.factors == {"domain": ["digits", "lower"], "operation": ["next", "previous"]}
    assert ps.splits == ["train", "test", None]
    assert ps.sites is None
    assert ps.texts == ["Q: 3\nA:", "Q: c\nA:", "The cat héllo\n"]
    m = ps.factor_matrix()
    assert m.dtype == np.int64
    np.testing.assert_array_equal(m, [[0, 0], [1, 1], [-1, 0]])
    path = tmp_path / "mine.jsonl"
    ps.save(path)
    back = hl.tasks.load_prompts(path)
    assert list(back) == MINE
    assert [json.loads(line) for line in path.read_text().splitlines()] == MINE
    assert hl.tasks.prompts(MINE[:2]).check_sites("query: last; keys: query_input, separator") == (1, 3)
    with pytest.raises(hl.InputError, match="prompt 2, site `query_input`"):
        ps.check_sites("query: last; keys: query_input")


@pytest.mark.parametrize(
    "bad, needle",
    [
        ([_prompt(("a", "r"))] + [{"segments": []}], ("prompt 1", "the prompt has no segment")),
        ([_prompt(("a", ""))], ("prompt 0", "segment 0 has an empty role")),
        ([_prompt(("", "r"))], ("prompt 0", "the prompt's text is empty")),
        ([_prompt(("a", "r"), split="val")], ("prompt 0", "unknown variant `val`")),
        ([_prompt(("a", "r"), lables={})], ("prompt 0", "unknown field `lables`")),
        ([_prompt(("a", "r"), labels={"k": 1})], ("prompt 0", "expected a string")),
        ([_prompt(("a", "r")), "text"], ("prompt 1", "must be a dict")),
        ([], ("prompts", "empty")),
    ],
)
def test_bad_prompts_name_the_prompt(bad, needle):
    with pytest.raises(hl.InputError) as e:
        hl.tasks.prompts(bad)
    assert all(n in str(e.value) for n in needle), str(e.value)


def test_bad_files_name_the_file_and_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps(MINE[0]) + "\n\n{oops\n")
    with pytest.raises(hl.HyperlensError) as e:
        hl.tasks.load_prompts(f)
    assert "p.jsonl: line 3:" in str(e.value)
    f.write_text("")
    with pytest.raises(hl.HyperlensError) as e:
        hl.tasks.load_prompts(f)
    assert "p.jsonl: line 0: the file holds no prompt" in str(e.value)
    with pytest.raises(hl.NotFoundError):
        hl.tasks.load_prompts(tmp_path / "absent.jsonl")


def test_unknown_roles_are_named_with_the_prompts_roles():
    ps = hl.tasks.prompts(MINE)
    with pytest.raises(hl.InputError) as e:
        ps.check_sites("query: last; keys: demo_output")
    assert "prompt 0, site `demo_output`" in str(e.value)
    assert "roles: separator, query_input" in str(e.value)
    with pytest.raises(hl.InputError, match="no `keys:`"):
        ps.check_sites("query: last")


def _icl_answer(operation, domain, x):
    values = {
        "lower": [chr(c) for c in range(ord("a"), ord("z") + 1)],
        "upper": [chr(c) for c in range(ord("A"), ord("Z") + 1)],
        "digits": [str(d) for d in range(10)],
        "number_words": "one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split(),
        "weekdays": "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split(),
        "months": "January February March April May June July August September October November "
        "December".split(),
    }[domain]
    step = {"copy": 0, "next": 1, "previous": -1, "skip_forward": 2, "skip_back": -2}[operation]
    i = values.index(x) + step
    assert 0 <= i < len(values)
    return values[i]


def test_icl_answers_are_correct_and_held_out_combinations_stay_out():
    ps = hl.tasks.icl(n=120, seed=4, shots=4)
    assert len(ps) == 120
    assert ps.sites == "query: last; keys: demo_output, query_input"
    assert ps.check_sites(ps.sites) == (1, 5)
    train, test = set(), set()
    for p in ps:
        op, dom = p["labels"]["operation"], p["labels"]["domain"]
        seg = {r: [s["text"][1:] for s in p["segments"] if s["role"] == r] for r in ("demo_input", "demo_output", "query_input")}
        for x, y in zip(seg["demo_input"], seg["demo_output"]):
            assert _icl_answer(op, dom, x) == y
        assert p["answer"] == " " + _icl_answer(op, dom, seg["query_input"][0])
        (train if p["split"] == "train" else test).add((op, dom))
    assert len(test) == 8 and not (train & test)
    assert {o for o, _ in train} == set(ps.factors["operation"])
    assert {d for _, d in train} == set(ps.factors["domain"])
    assert sorted(ps.unseen_in_training()) == sorted(f"domain={d},operation={o}" for o, d in test)
    with pytest.raises(hl.InputError, match="`n`"):
        hl.tasks.icl(n=10)


def test_relations_use_disjoint_vocabulary_halves():
    words = [f"w{i}" for i in range(40)]
    ps = hl.tasks.relations(n=50, seed=1, words=words)
    assert ps.sites == "query: query; keys: key"
    assert ps.factors == {"relation": ["bracket", "duplicate", "induction", "none", "previous"], "vocab": ["a", "b"]}
    seen = {"a": set(), "b": set()}
    for p in ps:
        w = [s["text"].strip() for s in p["segments"]]
        roles = [s["role"] for s in p["segments"]]
        k, q = roles.index("key"), roles.index("query")
        assert q == len(w) - 1
        rel = p["labels"]["relation"]
        if rel == "previous":
            assert k == q - 1
        elif rel == "duplicate":
            assert w[k] == w[q]
        elif rel == "induction":
            assert w[k - 1] == w[q]
        assert p["split"] == ("train" if p["labels"]["vocab"] == "a" else "test")
        seen[p["labels"]["vocab"]].update(x for x in w if x.startswith("w"))
    assert not (seen["a"] & seen["b"])
    assert ps.unseen_in_training() == ["vocab=b"]
    with pytest.raises(hl.InputError, match="at least 32"):
        hl.tasks.relations(n=10, words=words[:20])
    with pytest.raises(hl.InputError, match="word 1 must be a string"):
        hl.tasks.relations(n=10, words=["a", 3])


def test_the_generators_write_what_the_cli_writes(cli, tmp_path):
    out = tmp_path / "icl.jsonl"
    line = run_cli(cli, "tasks", "prompts", "--generator", "icl", "--n", "60", "--seed", "3", "--out", str(out))
    assert "--sites" in line
    ps = hl.tasks.icl(n=60, seed=3)
    ps.save(tmp_path / "py.jsonl")
    assert (tmp_path / "py.jsonl").read_bytes() == out.read_bytes()
    out = tmp_path / "rel.jsonl"
    run_cli(cli, "tasks", "prompts", "--generator", "relations", "--n", "30", "--seed", "5", "--out", str(out))
    assert list(hl.tasks.load_prompts(out)) == list(hl.tasks.relations(n=30, seed=5))
