"""Curated text sets (calibration / evaluation prompts) in JSONL: strict loader and validator.

One JSON object per line with exactly these string fields::

    {"id": "calib-en-short-001", "text": "Good morning.", "language": "en",
     "length": "short", "speaker": "seed:7"}

``speaker`` may also be a JSON integer, a speaker seed as ``--speaker 7`` takes
it: ``"speaker": 7`` loads as ``"seed:7"``.

Blank lines are skipped. Every problem in a file is collected and raised as one
:class:`TextSetError` naming the file, the line and the fix.

Command line: ``python -m toolkit.textsets FILE...`` validates each file and
prints its record count, sha256 and a language x length table; exit status 1 if
any file is invalid.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LANGUAGES",
    "LENGTHS",
    "FIELDS",
    "TextRecord",
    "TextSetError",
    "load_text_set",
    "set_hash",
    "summarize",
    "format_summary",
    "main",
]

LANGUAGES: tuple[str, ...] = ("en", "zh", "mixed")
"""Allowed ``language`` values; ``mixed`` is code-switched Mandarin/English."""

LENGTHS: tuple[str, ...] = ("short", "medium", "long")
"""Allowed ``length`` buckets: short < ~3 s of speech, medium 3-12 s, long up to ~40 s."""

FIELDS: tuple[str, ...] = ("id", "text", "language", "length", "speaker")
"""Required fields, all strings (``speaker`` may be an integer seed), no others allowed."""

SEED_RANGE = (-(2**63), 2**64 - 1)
"""Integer speaker seeds torch's generators accept."""

MAX_LISTED_ERRORS = 20

MAX_TEXT_CHARS = 4096
"""A record's text is one prompt (calibration feeds it whole): ~100x the longest bucket, far below what fills a
GPT's positions."""

MAX_LINE_BYTES = 64 * 1024
"""Longer lines are refused unread: a 100 MB line must not be decoded, parsed and embedded first."""


@dataclass(frozen=True, slots=True)
class TextRecord:
    """One prompt of a text set."""

    id: str
    text: str
    language: str
    length: str
    speaker: str


class TextSetError(ValueError):
    """A text set file is missing, unreadable or invalid.

    ``path`` is the offending file; ``problems`` lists ``(line, message)`` pairs
    (line 0 = the file as a whole) — all of them, even past the cap that the
    message text applies.
    """

    def __init__(self, path: str | Path, problems: Sequence[tuple[int, str]]) -> None:
        self.path = str(path)
        self.problems = list(problems)
        shown = [
            f"  {self.path}:{line}: {msg}" if line else f"  {self.path}: {msg}"
            for line, msg in self.problems[:MAX_LISTED_ERRORS]
        ]
        extra = len(self.problems) - len(shown)
        if extra > 0:
            shown.append(f"  ... and {extra} more")
        n = len(self.problems)
        head = f"invalid text set {self.path}: {n} problem{'s' if n != 1 else ''}"
        super().__init__(head + "\n" + "\n".join(shown))


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r} in object")
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_JSON_TYPE = {
    dict: "object",
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _json_type(value: Any) -> str:
    return _JSON_TYPE.get(type(value), type(value).__name__)


def _has_surrogate(s: str) -> bool:
    return any("\ud800" <= ch <= "\udfff" for ch in s)


def _check_record(obj: Any) -> list[str]:
    """Problems of one decoded line (empty list when it is a valid record)."""
    if not isinstance(obj, dict):
        return [
            f"record is a JSON {_json_type(obj)}, not an object; write one "
            f"object per line with fields {', '.join(FIELDS)}"
        ]
    msgs: list[str] = []
    missing = [f for f in FIELDS if f not in obj]
    extra = sorted(k for k in obj if k not in FIELDS)
    if missing:
        msgs.append(f"missing field(s) {', '.join(missing)}; every record needs {', '.join(FIELDS)}")
    if extra:
        msgs.append(f"unknown field(s) {', '.join(map(repr, extra))}; remove them (allowed: {', '.join(FIELDS)})")
    for field in FIELDS:
        if field not in obj:
            continue
        value = obj[field]
        if field == "speaker" and type(value) is int:  # a seed, as --speaker 7 takes it (JSON true is no seed)
            if not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
                msgs.append(
                    f"speaker seed {value} is out of range; use an integer from {SEED_RANGE[0]} to {SEED_RANGE[1]}"
                )
        elif not isinstance(value, str):
            msgs.append(
                f"field {field!r} is a JSON {_json_type(value)}, must be a string"
                + (" or an integer seed" if field == "speaker" else "")
            )
        elif _has_surrogate(value):
            msgs.append(
                f"field {field!r} contains an unpaired surrogate escape (\\ud800-\\udfff); use real Unicode characters"
            )
        elif not value.strip():
            what = "text" if field == "text" else "value"
            msgs.append(f"field {field!r} is empty or whitespace only; give it a non-empty {what}")
        elif field == "text" and len(value) > MAX_TEXT_CHARS:
            msgs.append(
                f"text is {len(value)} characters; a record holds at most {MAX_TEXT_CHARS} (one prompt): "
                "split it into several records"
            )
        elif field == "language" and value not in LANGUAGES:
            msgs.append(f"unknown language {value!r}; use one of {', '.join(LANGUAGES)}")
        elif field == "length" and value not in LENGTHS:
            msgs.append(f"unknown length bucket {value!r}; use one of {', '.join(LENGTHS)}")
    return msgs


def _lines(f) -> Iterable[bytes | None]:
    """The file's lines without their newline; None for a line over MAX_LINE_BYTES, which is skipped unread."""
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = f.readline(1 << 20)
            yield None
            continue
        yield raw[:-1] if raw.endswith(b"\n") else raw


def load_text_set(path: str | Path, *, limit: int | None = None, purpose: str | None = None) -> list[TextRecord]:
    """Read and validate a JSONL text set; raise :class:`TextSetError` listing every problem.
    limit: keep the first `limit` records. purpose ("calibration", "evaluation", ...): the records feed it, so
    none at all (an empty file, --limit 0) is an error naming it."""
    path = Path(path)
    if purpose and limit is not None and limit < 1:
        raise TextSetError(path, [(0, f"--limit {limit} leaves no text for {purpose}; give --limit 1 or more")])
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise TextSetError(
            path, [(0, "file not found; check the path (text sets live in calibration_sets/)")]
        ) from None
    except OSError as exc:
        raise TextSetError(
            path, [(0, f"cannot read file ({exc.strerror or exc}); pass a readable JSONL file")]
        ) from None

    with f:
        records = _read_records(path, f)
    if purpose and not records[:limit]:
        raise TextSetError(
            path,
            [
                (
                    0,
                    f"the file holds no records; {purpose} needs at least one text (one JSON "
                    f"object per line with fields {', '.join(FIELDS)})",
                )
            ],
        )
    return records[:limit]


def _read_records(path: Path, f) -> list[TextRecord]:
    problems: list[tuple[int, str]] = []
    records: list[TextRecord] = []
    first_line_of: dict[str, int] = {}
    offset = 0
    for lineno, raw in enumerate(_lines(f), start=1):
        if raw is None:
            problems.append(
                (
                    lineno,
                    f"line is longer than {MAX_LINE_BYTES // 1024} KiB; a record's text holds at "
                    f"most {MAX_TEXT_CHARS} characters: split it into several records",
                )
            )
            continue
        line_start, offset = offset, offset + len(raw) + 1
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            problems.append((1, "file starts with a UTF-8 byte-order mark; save it as UTF-8 without BOM"))
            raw = raw[3:]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(
                (
                    lineno,
                    f"not valid UTF-8 at byte offset {line_start + exc.start} "
                    f"(byte 0x{raw[exc.start]:02x}); re-save the file as UTF-8",
                )
            )
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            problems.append((lineno, f"bad JSON ({exc}); each non-blank line must be one JSON object"))
            continue
        msgs = _check_record(obj)
        if msgs:
            problems.extend((lineno, m) for m in msgs)
            continue
        if type(obj["speaker"]) is int:
            obj["speaker"] = f"seed:{obj['speaker']}"
        rec = TextRecord(**{f: obj[f] for f in FIELDS})
        if rec.id in first_line_of:
            problems.append(
                (
                    lineno,
                    f"duplicate id {rec.id!r} (first used on line "
                    f"{first_line_of[rec.id]}, again on line {lineno}); "
                    "ids must be unique within a file",
                )
            )
            continue
        first_line_of[rec.id] = lineno
        records.append(rec)
    if problems:
        raise TextSetError(path, problems)
    return records


def set_hash(path: str | Path) -> str:
    """sha256 (hex) of the file's bytes, for quantization manifests."""
    try:
        with Path(path).open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as exc:
        raise TextSetError(path, [(0, f"cannot read file ({exc.strerror or exc}); check the path")]) from None


def summarize(records: Iterable[TextRecord]) -> dict[str, dict[str, int]]:
    """Counts as ``{language: {length: n}}``, every language and bucket present (zeros included)."""
    counts = {lang: {length: 0 for length in LENGTHS} for lang in LANGUAGES}
    for rec in records:
        counts[rec.language][rec.length] += 1
    return counts


def format_summary(counts: dict[str, dict[str, int]]) -> str:
    """Markdown table of :func:`summarize` output with row and column totals."""
    lines = ["| language | " + " | ".join(LENGTHS) + " | total |", "|---|" + "---:|" * (len(LENGTHS) + 1)]
    col = dict.fromkeys(LENGTHS, 0)
    for lang in LANGUAGES:
        row = counts.get(lang, {})
        cells = [row.get(length, 0) for length in LENGTHS]
        for length, n in zip(LENGTHS, cells):
            col[length] += n
        lines.append(f"| {lang} | " + " | ".join(map(str, cells)) + f" | {sum(cells)} |")
    lines.append("| total | " + " | ".join(str(col[length]) for length in LENGTHS) + f" | {sum(col.values())} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toolkit.textsets", description="Validate JSONL text sets and print language x length counts."
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="JSONL text set(s)")
    args = parser.parse_args(argv)
    status = 0
    for name in args.files:
        try:
            records = load_text_set(name)
        except TextSetError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"{name}: {len(records)} records, sha256 {set_hash(name)}")
        print(format_summary(summarize(records)))
        print()
    return status


if __name__ == "__main__":
    sys.exit(main())
