"""Tests for toolkit.textsets and the shipped calibration_sets/*.jsonl."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.textsets import (
    FIELDS,
    LANGUAGES,
    LENGTHS,
    MAX_LISTED_ERRORS,
    TextRecord,
    TextSetError,
    format_summary,
    load_text_set,
    main,
    set_hash,
    summarize,
)

ROOT = Path(__file__).resolve().parents[1]
SETS = ROOT / "calibration_sets"
CALIB, EVAL, SMOKE = SETS / "calib.jsonl", SETS / "eval.jsonl", SETS / "smoke.jsonl"
CONTROL = re.compile(r"\[(?:laugh|uv_break|lbreak)\]")
CJK = re.compile(r"[\u4e00-\u9fff]")


def good(**overrides: object) -> dict[str, object]:
    rec: dict[str, object] = {
        "id": "r1",
        "text": "Hello there.",
        "language": "en",
        "length": "short",
        "speaker": "seed:7",
    }
    rec.update(overrides)
    return rec


def write_lines(tmp_path: Path, lines: list[str], name: str = "set.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def problems_of(path: Path) -> TextSetError:
    with pytest.raises(TextSetError) as info:
        load_text_set(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert str(path) in str(err)
    return err


def assert_problem(path: Path, line: int, *needles: str) -> TextSetError:
    """The error names the file and `line`, and that line's message contains every needle."""
    err = problems_of(path)
    assert f"{path}:{line}:" in str(err), str(err)
    msgs = [m for ln, m in err.problems if ln == line]
    assert msgs, err.problems
    joined = " | ".join(msgs)
    for needle in needles:
        assert needle in joined, (needle, joined)
    return err


# --------------------------------------------------------------------------- shipped sets


@pytest.fixture(scope="module")
def shipped() -> dict[str, list[TextRecord]]:
    return {"calib": load_text_set(CALIB), "eval": load_text_set(EVAL), "smoke": load_text_set(SMOKE)}


def test_shipped_sizes(shipped: dict[str, list[TextRecord]]) -> None:
    assert len(shipped["calib"]) >= 240
    assert len(shipped["eval"]) >= 120
    smoke = shipped["smoke"]
    assert len(smoke) == 6
    assert Counter(r.language for r in smoke) == {"en": 3, "zh": 2, "mixed": 1}
    assert {r.length for r in smoke} == {"short"}


@pytest.mark.parametrize("name", ["calib", "eval"])
def test_shipped_grid_and_coverage(shipped: dict[str, list[TextRecord]], name: str) -> None:
    recs = shipped[name]
    counts = summarize(recs)
    for lang in LANGUAGES:
        for length in LENGTHS:
            assert counts[lang][length] > 0, (name, lang, length)
    assert all(r.id.startswith(f"{name}-") for r in recs)
    joined = "\n".join(r.text for r in recs)
    patterns = {
        "digits": r"\d",
        "percentage": r"\d%",
        "currency": r"[$€£¥]\s?\d|\d+元",
        "clock time": r"\b\d{1,2}:\d{2}\b",
        "date": r"\d{4}年|\d+月\d+日|\b(?:January|March|April|May|June|September)\s\d|\d{2}/\d{2}/\d{4}",
        "phone number": r"\d{3}-\d{3,4}-\d{4}|\d{3}-\d{4}|\d{3} \d{4} \d{4}",
        "abbreviation": r"\b[A-Z]{2,}\b",
        "english question": r"[A-Za-z]\?",
        "english exclamation": r"[A-Za-z]!",
        "ascii punctuation": r"[;:\"()-]",
    }
    for what, pat in patterns.items():
        assert re.search(pat, joined), f"{name} lacks {what}"
    for ch in "，。！？、；：“”《》":
        assert ch in joined, f"{name} lacks {ch}"
    for token in ("[laugh]", "[uv_break]", "[lbreak]"):
        assert token in joined, f"{name} lacks {token}"
    frac = sum(bool(CONTROL.search(r.text)) for r in recs) / len(recs)
    assert 0.05 <= frac <= 0.2, frac
    # mixed records really code-switch; en has no Hanzi; zh has no Latin words
    for r in recs:
        plain = CONTROL.sub("", r.text)
        has_cjk, has_latin = bool(CJK.search(plain)), bool(re.search(r"[A-Za-z]{2,}", plain))
        expected = {"en": (False, True), "zh": (True, False), "mixed": (True, True)}[r.language]
        assert (has_cjk, has_latin) == expected, r
    speakers = Counter(r.speaker for r in recs)
    assert 3 <= len(speakers) <= 10
    assert max(speakers.values()) - min(speakers.values()) <= 2, speakers
    assert all(re.fullmatch(r"seed:\d+|[a-z]{2}-[a-z]{2}/[a-z]\d+", s) for s in speakers), speakers
    # named voices only read text in their own language (mixed may use either)
    assert not [r for r in recs if r.language == "zh" and r.speaker.startswith("en-")]
    assert not [r for r in recs if r.language == "en" and r.speaker.startswith("zh-")]


def _estimated_seconds(text: str) -> float:
    """Very rough speaking time: ~0.36 s per English word, ~0.22 s per Hanzi, digits read out."""
    plain = CONTROL.sub("", text)
    words = len(re.findall(r"[A-Za-z]+", plain))
    hanzi = len(CJK.findall(plain))
    digits = len(re.findall(r"\d", plain))
    return 0.36 * words + 0.22 * hanzi + 0.3 * digits


@pytest.mark.parametrize("path", [CALIB, EVAL])
def test_shipped_length_buckets_are_plausible(path: Path) -> None:
    bounds = {"short": (0.3, 4.0), "medium": (2.5, 14.0), "long": (10.0, 45.0)}
    for r in load_text_set(path):
        lo, hi = bounds[r.length]
        assert lo <= _estimated_seconds(r.text) <= hi, r


def test_calib_eval_disjoint_and_smoke_subset(shipped: dict[str, list[TextRecord]]) -> None:
    def norm(t: str) -> str:
        return " ".join(t.split()).casefold()

    calib_texts = {norm(r.text) for r in shipped["calib"]}
    eval_texts = {norm(r.text) for r in shipped["eval"]}
    assert len(calib_texts) == len(shipped["calib"])
    assert len(eval_texts) == len(shipped["eval"])
    assert not calib_texts & eval_texts
    assert not {r.id for r in shipped["calib"]} & {r.id for r in shipped["eval"]}
    assert set(shipped["smoke"]) <= set(shipped["eval"])


def test_set_hash_is_sha256_of_bytes(tmp_path: Path) -> None:
    assert set_hash(CALIB) == hashlib.sha256(CALIB.read_bytes()).hexdigest()
    p = write_lines(tmp_path, [json.dumps(good())])
    h1 = set_hash(p)
    p.write_text(json.dumps(good(text="Hello there!")) + "\n", encoding="utf-8")
    assert set_hash(p) != h1 and len(h1) == 64
    with pytest.raises(TextSetError, match="nope.jsonl"):
        set_hash(tmp_path / "nope.jsonl")


def test_summarize_and_table() -> None:
    recs = [
        TextRecord("a", "x", "en", "short", "s"),
        TextRecord("b", "y", "en", "short", "s"),
        TextRecord("c", "z", "mixed", "long", "s"),
    ]
    counts = summarize(recs)
    assert counts == {
        "en": {"short": 2, "medium": 0, "long": 0},
        "zh": {"short": 0, "medium": 0, "long": 0},
        "mixed": {"short": 0, "medium": 0, "long": 1},
    }
    table = format_summary(counts)
    assert "| en | 2 | 0 | 0 | 2 |" in table
    assert "| total | 2 | 0 | 1 | 3 |" in table


# --------------------------------------------------------------------------- CLI


def test_cli_ok_and_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(SMOKE)]) == 0
    out = capsys.readouterr().out
    assert "6 records" in out and set_hash(SMOKE) in out and "| en | 3 | 0 | 0 | 3 |" in out
    bad = write_lines(tmp_path, [json.dumps(good()), json.dumps(good(language="fr"))])
    assert main([str(SMOKE), str(bad)]) == 1
    captured = capsys.readouterr()
    assert f"{bad}:2:" in captured.err and "unknown language 'fr'" in captured.err
    assert "6 records" in captured.out


def test_cli_as_module(tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "toolkit.textsets", str(SMOKE)], cwd=ROOT, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert "| total | 6 | 0 | 0 | 6 |" in ok.stdout
    missing = tmp_path / "missing.jsonl"
    bad = subprocess.run(
        [sys.executable, "-m", "toolkit.textsets", str(missing)], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 1 and str(missing) in bad.stderr and "not found" in bad.stderr


# --------------------------------------------------------------------------- failure modes


def test_valid_file_with_blank_lines_and_crlf(tmp_path: Path) -> None:
    p = tmp_path / "ok.jsonl"
    p.write_bytes(
        b"\n  \n"
        + json.dumps(good()).encode()
        + b"\r\n\t\n"
        + json.dumps(good(id="r2", text="你好。", language="zh")).encode()
    )
    recs = load_text_set(p)
    assert [r.id for r in recs] == ["r1", "r2"]
    assert recs[1] == TextRecord("r2", "你好。", "zh", "short", "seed:7")


def test_missing_file(tmp_path: Path) -> None:
    err = problems_of(tmp_path / "absent.jsonl")
    assert "not found" in str(err)


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    err = problems_of(tmp_path)
    assert "cannot read" in str(err)


def test_not_utf8_names_line_and_byte_offset(tmp_path: Path) -> None:
    p = tmp_path / "latin1.jsonl"
    first = json.dumps(good()).encode() + b"\n"
    second = json.dumps(good(id="r2", text="caf\u00e9")).encode("utf-8").replace(b"\\u00e9", b"\xe9")
    p.write_bytes(first + second + b"\n")
    offset = len(first) + second.index(b"\xe9")
    err = assert_problem(p, 2, "not valid UTF-8", f"byte offset {offset}", "0xe9", "UTF-8")
    assert len(err.problems) == 1


def test_utf8_bom_is_reported(tmp_path: Path) -> None:
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(good()).encode() + b"\n")
    assert_problem(p, 1, "byte-order mark", "without BOM")


def test_bad_json(tmp_path: Path) -> None:
    p = write_lines(tmp_path, [json.dumps(good()), '{"id": "r2", "text": "oops",'])
    assert_problem(p, 2, "bad JSON", "one JSON object")


@pytest.mark.parametrize(
    "line,kind", [('["a", "b"]', "array"), ('"just text"', "string"), ("42", "number"), ("null", "null")]
)
def test_record_not_an_object(tmp_path: Path, line: str, kind: str) -> None:
    p = write_lines(tmp_path, [line])
    assert_problem(p, 1, f"JSON {kind}, not an object", "one object per line")


def test_missing_fields(tmp_path: Path) -> None:
    rec = good()
    del rec["speaker"], rec["length"]
    p = write_lines(tmp_path, [json.dumps(good(id="r0")), json.dumps(rec)])
    assert_problem(p, 2, "missing field(s) length, speaker", "every record needs")


def test_extra_fields(tmp_path: Path) -> None:
    p = write_lines(tmp_path, [json.dumps(good(emotion="happy"))])
    assert_problem(p, 1, "unknown field(s) 'emotion'", "remove them")


@pytest.mark.parametrize(
    "field,value,kind",
    [("text", 5, "number"), ("id", None, "null"), ("speaker", ["a"], "array"), ("length", True, "boolean")],
)
def test_wrongly_typed_field(tmp_path: Path, field: str, value: object, kind: str) -> None:
    p = write_lines(tmp_path, [json.dumps(good(**{field: value}))])
    assert_problem(p, 1, f"field {field!r} is a JSON {kind}, must be a string")


def test_integer_speaker_is_a_seed_as_on_the_command_line(tmp_path: Path) -> None:
    """Issue 40, item 8: "speaker": 0 (a JSON number) was refused. An integer is a speaker seed, as `--speaker 0`
    takes it: it loads as "seed:0", which names the same speaker vector as the integer does."""
    import torch

    from toolkit.models.speaker import random_speaker
    from toolkit.params import speaker_seed

    p = write_lines(tmp_path, [json.dumps(good(id=f"r{i}", speaker=seed)) for i, seed in enumerate([0, 7, -3, 2**63])])
    recs = load_text_set(p)
    assert [r.speaker for r in recs] == ["seed:0", "seed:7", "seed:-3", f"seed:{2**63}"]
    assert [speaker_seed(r.speaker) for r in recs] == [0, 7, -3, 2**63]
    stat = torch.stack([torch.ones(8), torch.zeros(8)])
    for r, seed in zip(recs, [0, 7, -3, 2**63]):  # every seed accepted is one torch's generator takes
        assert torch.equal(random_speaker(speaker_seed(r.speaker), stat), random_speaker(seed, stat))


@pytest.mark.parametrize(
    "value,message",
    [
        (True, "is a JSON boolean, must be a string or an integer seed"),
        (1.0, "is a JSON number, must be a string or an integer seed"),
        (2**64, "speaker seed 18446744073709551616 is out of range"),
        (-(2**63) - 1, "out of range"),
    ],
)
def test_speaker_that_is_no_seed_is_refused(tmp_path: Path, value: object, message: str) -> None:
    p = write_lines(tmp_path, [json.dumps(good(speaker=value))])
    assert_problem(p, 1, message)


@pytest.mark.parametrize("field,value", [("text", ""), ("text", " \t\u3000 "), ("id", ""), ("speaker", "  ")])
def test_empty_or_whitespace_fields(tmp_path: Path, field: str, value: str) -> None:
    p = write_lines(tmp_path, [json.dumps(good(**{field: value}))])
    assert_problem(p, 1, f"field {field!r} is empty or whitespace only")


def test_unknown_language_lists_allowed(tmp_path: Path) -> None:
    p = write_lines(tmp_path, [json.dumps(good(language="EN"))])
    assert_problem(p, 1, "unknown language 'EN'", "en, zh, mixed")


def test_unknown_length_bucket(tmp_path: Path) -> None:
    p = write_lines(tmp_path, [json.dumps(good(length="tiny"))])
    assert_problem(p, 1, "unknown length bucket 'tiny'", "short, medium, long")


def test_duplicate_id_names_both_lines(tmp_path: Path) -> None:
    p = write_lines(
        tmp_path, [json.dumps(good()), "", json.dumps(good(id="r2")), json.dumps(good(text="Another one."))]
    )
    assert_problem(p, 4, "duplicate id 'r1'", "first used on line 1", "again on line 4")


def test_duplicate_key_and_nan_rejected(tmp_path: Path) -> None:
    p = write_lines(
        tmp_path,
        ['{"id": "a", "id": "b", "text": "x", "language": "en", "length": "short", "speaker": "s"}', '{"id": NaN}'],
    )
    err = problems_of(p)
    assert [ln for ln, _ in err.problems] == [1, 2]
    assert "duplicate key 'id'" in err.problems[0][1] and "NaN" in err.problems[1][1]


def test_lone_surrogate_rejected(tmp_path: Path) -> None:
    p = write_lines(tmp_path, [json.dumps(good(text="bad \ud800 text"))])
    assert_problem(p, 1, "unpaired surrogate")


def test_deeply_nested_json_is_a_text_set_error(tmp_path: Path) -> None:
    p = write_lines(tmp_path, ["[" * 30_000 + "]" * 30_000])  # within MAX_LINE_BYTES, far past the recursion limit
    assert_problem(p, 1, "bad JSON")


def test_all_errors_collected_and_capped(tmp_path: Path) -> None:
    lines = [json.dumps(good(id=f"r{i}", language="xx")) for i in range(MAX_LISTED_ERRORS + 5)]
    lines.insert(3, "not json")
    p = write_lines(tmp_path, lines)
    err = problems_of(p)
    assert len(err.problems) == MAX_LISTED_ERRORS + 6
    msg = str(err)
    assert f"{MAX_LISTED_ERRORS + 6} problems" in msg
    assert "and 6 more" in msg
    assert f"{p}:4: bad JSON" in msg
    assert msg.count(f"\n  {p}:") == MAX_LISTED_ERRORS


# --------------------------------------------------------------------------- properties

nonblank = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() != "")
record_dicts = st.fixed_dictionaries(
    {
        "id": nonblank,
        "text": st.text(min_size=1, max_size=200).filter(lambda s: s.strip() != ""),
        "language": st.sampled_from(LANGUAGES),
        "length": st.sampled_from(LENGTHS),
        "speaker": nonblank,
    }
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=8,
)
mutated_records = st.builds(
    lambda rec, key, value, drop: {k: v for k, v in rec.items() if k != drop} | {key: value},
    record_dicts,
    st.sampled_from(FIELDS + ("extra",)),
    json_values,
    st.sampled_from(FIELDS + ("",)),
)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _load_bytes(data: bytes) -> list[TextRecord]:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "prop.jsonl"
        p.write_bytes(data)
        return load_text_set(p)


@FAST
@given(st.lists(record_dicts, min_size=1, max_size=6, unique_by=lambda r: r["id"]), st.booleans())
def test_valid_records_round_trip(recs: list[dict[str, str]], ascii_only: bool) -> None:
    data = "\n".join(json.dumps(r, ensure_ascii=ascii_only) for r in recs).encode("utf-8")
    loaded = _load_bytes(data)
    assert loaded == [TextRecord(**r) for r in recs]
    assert summarize(loaded)[recs[0]["language"]][recs[0]["length"]] >= 1


@FAST
@given(
    st.lists(st.one_of(st.text(max_size=80), json_values.map(json.dumps), mutated_records.map(json.dumps)), max_size=8)
)
def test_arbitrary_lines_only_raise_text_set_error(lines: list[str]) -> None:
    try:
        recs = _load_bytes("\n".join(lines).encode("utf-8"))
    except TextSetError as exc:
        assert exc.problems and all(ln >= 1 for ln, _ in exc.problems)
    else:
        assert all(isinstance(r, TextRecord) for r in recs)


@FAST
@given(st.binary(max_size=300))
def test_arbitrary_bytes_only_raise_text_set_error(data: bytes) -> None:
    try:
        _load_bytes(data)
    except TextSetError as exc:
        assert exc.problems
