"""SkillSpan (Zhang et al., NAACL 2022) CoNLL files -> ``records.jsonl`` to extract, ``gold.jsonl`` to score.

Each line of a SkillSpan file is ``token<TAB>skill-BIO<TAB>knowledge-BIO``; blank lines end sentences and a
``###`` line (when a file has them) ends a posting. A record's text is its tokens joined by single spaces,
the same way each gold span is joined, so every gold span is a verbatim substring of its record::

    python -m pipeline.bench.skillspan ../shared/datasets/skillspan/skillspan_house_dev.conll \\
        ../shared/datasets/skillspan/skillspan_tech_dev.conll --out data/skillspan

Ids are the file's stem (without ``skillspan_``) and the unit's position in the file, counting skipped
units too, so the same file always gives the same ids (``house_dev-000123``) and records match gold.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import orjson

from pipeline.errors import ConfigError
from pipeline.job.commands import command

Unit = Literal["sentence", "posting"]
UNITS: tuple[str, ...] = get_args(Unit)

RECORDS_FILE = "records.jsonl"
GOLD_FILE = "gold.jsonl"
#: Fewer tokens than this is a heading or a bullet fragment, not a sentence worth a request.
MIN_TOKENS = 3
POSTING_SEPARATOR = "###"
# The dataset's anonymisation placeholders: <ORGANIZATION>, <ADDRESS>, <COMPANY_TYPE>, ...
_ANONYMISED = re.compile(r"<[A-Z][A-Z_]*>")
_TAG = re.compile(r"([BI])-(\w+)")
_COLUMNS = ((1, "Skill"), (2, "Knowledge"))  # (column index, the only span type it may hold)


@dataclass(frozen=True, slots=True)
class Sentence:
    tokens: tuple[str, ...]
    skills: tuple[str, ...]  # every span, in order, duplicates included
    knowledge: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ConllFile:
    path: Path
    postings: tuple[tuple[Sentence, ...], ...]  # the whole file is one posting without ``###`` lines
    has_separators: bool
    repaired: int  # I- tags without a B- that were read as B- (lenient only)


@dataclass(frozen=True, slots=True)
class GoldRecord:
    id: str
    text: str
    skills: tuple[str, ...]  # each distinct span once, in order of first appearance
    knowledge: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Conversion:
    """What the files hold: the records kept, and what was skipped or repaired on the way."""

    records: tuple[GoldRecord, ...]
    skills: int  # spans in the kept records, duplicates included (so: their B- tags)
    knowledge: int
    skipped: int  # units with fewer than MIN_TOKENS tokens or no word but anonymised placeholders
    skipped_skills: int
    skipped_knowledge: int
    repaired: int


@dataclass(frozen=True, slots=True)
class ConvertReport:
    records_path: Path
    gold_path: Path
    unit: Unit
    records: int
    skills: int
    knowledge: int
    skipped: int
    skipped_skills: int
    skipped_knowledge: int
    repaired: int


def read_conll(path: Path, *, lenient: bool = False) -> ConllFile:
    """Parse one SkillSpan file. Bad input is a :class:`ConfigError` naming the file and the line."""
    lines = _read_lines(path)
    postings: list[tuple[Sentence, ...]] = []
    sentences: list[Sentence] = []
    rows: list[tuple[int, list[str]]] = []  # the current sentence: (line number, its three columns)
    separators = repaired = 0
    for number, line in enumerate([*lines, ""], 1):  # a final blank line closes the last sentence
        # A token row that happens to start with ### (three columns) is a token, not a separator.
        separator = line.startswith(POSTING_SEPARATOR) and line.count("\t") != 2
        if separator or not line.strip():
            if rows:
                sentence, fixed = _sentence(path, rows, lenient=lenient)
                sentences.append(sentence)
                repaired += fixed
                rows = []
            if separator and sentences:
                postings.append(tuple(sentences))
                sentences = []
            separators += separator
            continue
        columns = line.split("\t")
        if len(columns) != 3:
            raise ConfigError(
                f"{path}:{number}: expected 3 tab-separated columns (token, skill tag, knowledge tag), "
                f"got {len(columns)}"
            )
        if not columns[0].strip():
            raise ConfigError(f"{path}:{number}: empty token")
        rows.append((number, [column.strip() for column in columns]))
    if sentences:
        postings.append(tuple(sentences))
    return ConllFile(path, tuple(postings), separators > 0, repaired)


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _sentence(path: Path, rows: Sequence[tuple[int, list[str]]], *, lenient: bool) -> tuple[Sentence, int]:
    tokens = tuple(columns[0] for _, columns in rows)
    skills, fixed_skills = _spans(path, rows, 1, "Skill", lenient=lenient)
    knowledge, fixed_knowledge = _spans(path, rows, 2, "Knowledge", lenient=lenient)
    return Sentence(tokens, skills, knowledge), fixed_skills + fixed_knowledge


def _spans(
    path: Path, rows: Sequence[tuple[int, list[str]]], column: int, kind: str, *, lenient: bool
) -> tuple[tuple[str, ...], int]:
    """The BIO spans of one column, each as its tokens joined by single spaces; and how many I- tags
    without a B- were read as B- (conlleval's reading, only when ``lenient``)."""
    spans: list[list[str]] = []
    inside = False
    repaired = 0
    for number, columns in rows:
        tag = columns[column]
        match = _TAG.fullmatch(tag)
        if tag != "O" and (match is None or match.group(2) != kind):
            raise ConfigError(
                f"{path}:{number}: unknown {kind.lower()} tag {tag!r} in column {column + 1} "
                f"(expected O, B-{kind} or I-{kind})"
            )
        if match is not None and match.group(1) == "I" and not inside:
            if not lenient:
                raise ConfigError(
                    f"{path}:{number}: I-{kind} without B-{kind} before it in the sentence "
                    "(--lenient reads it as B-)"
                )
            repaired += 1
        if match is not None and (match.group(1) == "B" or not inside):
            spans.append([columns[0]])
        elif match is not None:
            spans[-1].append(columns[0])
        inside = match is not None
    return tuple(" ".join(span) for span in spans), repaired


def is_skipped(tokens: Sequence[str]) -> bool:
    """Too short to be a sentence, or nothing in it but placeholders and punctuation."""
    if len(tokens) < MIN_TOKENS:
        return True
    return not any(_ANONYMISED.fullmatch(token) is None and _has_word(token) for token in tokens)


def _has_word(token: str) -> bool:
    return any(character.isalnum() for character in token)


def file_key(path: Path) -> str:
    """The id prefix of a file's records: ``skillspan_house_dev.conll`` -> ``house_dev``."""
    return path.stem.removeprefix("skillspan_")


def collect(files: Sequence[Path], *, unit: Unit = "sentence", lenient: bool = False) -> Conversion:
    """Every file's units as records with their gold spans, in file order; nothing is written."""
    if unit not in UNITS:
        raise ConfigError(f"unknown unit {unit!r}; use one of {', '.join(UNITS)}")
    if not files:
        raise ConfigError("no SkillSpan files given")
    records: list[GoldRecord] = []
    kept: list[Sentence] = []
    skipped: list[Sentence] = []
    skipped_units = repaired = 0
    for path in _unique_keys(files):
        parsed = read_conll(path, lenient=lenient)
        repaired += parsed.repaired
        for index, sentences in enumerate(_units(parsed, unit)):
            if is_skipped([token for sentence in sentences for token in sentence.tokens]):
                skipped.extend(sentences)
                skipped_units += 1
                continue
            kept.extend(sentences)
            records.append(_record(f"{file_key(path)}-{index:06d}", sentences))
    return Conversion(
        records=tuple(records),
        skills=sum(len(sentence.skills) for sentence in kept),
        knowledge=sum(len(sentence.knowledge) for sentence in kept),
        skipped=skipped_units,
        skipped_skills=sum(len(sentence.skills) for sentence in skipped),
        skipped_knowledge=sum(len(sentence.knowledge) for sentence in skipped),
        repaired=repaired,
    )


def _unique_keys(files: Sequence[Path]) -> Iterable[Path]:
    seen: dict[str, Path] = {}
    for path in files:
        key = file_key(path)
        if key in seen:
            raise ConfigError(
                f"{path}: its records would get the same ids ('{key}-...') as those of {seen[key]}; "
                "give each file a different name"
            )
        seen[key] = path
        yield path


def _units(parsed: ConllFile, unit: Unit) -> list[tuple[Sentence, ...]]:
    if unit == "sentence":
        return [(sentence,) for posting in parsed.postings for sentence in posting]
    if not parsed.has_separators:
        # One record of a whole file is never what was meant: say so instead of sending 20,000 tokens.
        raise ConfigError(
            f"{parsed.path}: no '{POSTING_SEPARATOR}' lines separate its postings; convert it by sentence"
        )
    return list(parsed.postings)


def _record(record_id: str, sentences: Sequence[Sentence]) -> GoldRecord:
    # Sentences of a posting go on their own lines: a span never crosses one, so spans stay verbatim.
    return GoldRecord(
        id=record_id,
        text="\n".join(" ".join(sentence.tokens) for sentence in sentences),
        skills=tuple(dict.fromkeys(span for sentence in sentences for span in sentence.skills)),
        knowledge=tuple(dict.fromkeys(span for sentence in sentences for span in sentence.knowledge)),
    )


def convert(
    files: Sequence[Path], out_dir: Path, *, unit: Unit = "sentence", lenient: bool = False
) -> ConvertReport:
    """Write ``out_dir/records.jsonl`` (id, text) and ``out_dir/gold.jsonl`` (id, skills, knowledge).

    Every file is read and checked before anything is written; each output file is written beside its
    final path and renamed into place, so an interrupted run leaves the previous files whole.
    """
    conversion = collect(files, unit=unit, lenient=lenient)
    records_path, gold_path = out_dir / RECORDS_FILE, out_dir / GOLD_FILE
    records = [{"id": record.id, "text": record.text} for record in conversion.records]
    gold = [
        {"id": record.id, "skills": list(record.skills), "knowledge": list(record.knowledge)}
        for record in conversion.records
    ]
    _write_jsonl_files({records_path: records, gold_path: gold})
    return ConvertReport(
        records_path=records_path,
        gold_path=gold_path,
        unit=unit,
        records=len(conversion.records),
        skills=conversion.skills,
        knowledge=conversion.knowledge,
        skipped=conversion.skipped,
        skipped_skills=conversion.skipped_skills,
        skipped_knowledge=conversion.skipped_knowledge,
        repaired=conversion.repaired,
    )


def _write_jsonl_files(contents: Mapping[Path, Sequence[Mapping[str, object]]]) -> None:
    temporaries: dict[Path, Path] = {}
    current = Path()
    try:
        for current, rows in contents.items():
            current.parent.mkdir(parents=True, exist_ok=True)
            temporary = current.with_name(f".{current.name}.{secrets.token_hex(4)}.tmp")
            temporaries[current] = temporary
            temporary.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
        for current, temporary in temporaries.items():
            os.replace(temporary, current)  # same folder, so atomic: the old file or the new one
    except OSError as exc:
        raise ConfigError(f"{current}: cannot write ({exc.strerror or exc})") from exc
    finally:
        for temporary in temporaries.values():
            temporary.unlink(missing_ok=True)


def describe(report: ConvertReport) -> str:
    """What ``convert`` did, for a terminal: the counts, where the files are, and what to run next."""
    skipped = f"skipped {report.skipped:,} {report.unit}s (under {MIN_TOKENS} tokens or only placeholders"
    if report.skipped_skills or report.skipped_knowledge:
        skipped += f"; {report.skipped_skills:,} skill and {report.skipped_knowledge:,} knowledge spans"
    lines = [
        f"records {report.records:,}  skills {report.skills:,}  knowledge {report.knowledge:,}  {skipped})",
        f"records: {report.records_path}",
        f"gold:    {report.gold_path}",
    ]
    if report.repaired:
        lines.insert(1, f"read {report.repaired:,} I- tag(s) without a B- before them as B- (--lenient)")
    lines.append(f"next:    {command('load', str(report.records_path), '--job', 'jobs/skillspan.yaml')}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipeline.bench.skillspan FILE... --out DIR``; exit code 2 with one line on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.bench.skillspan",
        description="Convert SkillSpan CoNLL files into records.jsonl (to load and extract) and "
        "gold.jsonl (to score against).",
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="SkillSpan .conll files")
    parser.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="folder for records.jsonl and gold.jsonl"
    )
    parser.add_argument(
        "--unit", choices=UNITS, default="sentence", help="one record per ... (default: sentence)"
    )
    parser.add_argument(
        "--lenient",
        action="store_true",
        help="read an I- tag without a B- before it as B- instead of failing",
    )
    arguments = parser.parse_args(argv)
    try:
        report = convert(arguments.files, arguments.out, unit=arguments.unit, lenient=arguments.lenient)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(describe(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
