"""What ``status`` says about long records (``chunking:``): how many results were merged from chunks,
from how many, what each pass added, and the chunks kept for records not finished yet (a run stopped
mid-document: the next one asks only for the rest)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.job.spec import JobSpec
from pipeline.source.db import Database, quote
from pipeline.store.tables import chunks_table
from pipeline.wording import counted


@dataclass(frozen=True, slots=True)
class ChunkingStatus:
    records: int  # results merged from chunks
    chunks: int  # the chunks they were merged from
    # Values each pass found first, every pass the results ran counted (0 when it found nothing new).
    added_by_pass: dict[int, int] = field(default_factory=dict)
    unfinished: int = 0  # records with kept chunks and no result yet
    kept: int = 0  # the chunks kept for those
    whole: int = 0  # with `chunking:` in the job, results of records that fit and were sent whole
    passes: int = 1  # the job's `chunking.passes`

    def to_json(self) -> dict[str, object]:
        return {
            "records": self.records,
            "chunks": self.chunks,
            "added_by_pass": {str(number): count for number, count in self.added_by_pass.items()},
            "unfinished_records": self.unfinished,
            "kept_chunks": self.kept,
            "whole_records": self.whole,
            "passes": self.passes,
        }

    def describe(self) -> str:
        """``12 records from 87 chunks; values found by pass 1: 540, pass 2: +37 (+6.9%)``."""
        if not self.records:
            text = f"no record was split: the {self.whole:,} done fit whole"
            if self.passes > 1:
                text += f" (passes: {self.passes} applies to split records only)"
            return text + self._unfinished()
        whole = f" ({self.whole:,} sent whole)" if self.whole else ""
        text = f"{counted(self.records, 'record')} from {counted(self.chunks, 'chunk')}{whole}"
        passes = sorted(self.added_by_pass.items())
        if passes:
            first = passes[0][1]
            later = [
                f"pass {number}: +{count:,}" + (f" ({count / first:+.1%})" if first else "")
                for number, count in passes[1:]
            ]
            text += "; values found by " + ", ".join([f"pass {passes[0][0]}: {first:,}", *later])
        return text + self._unfinished()

    def _unfinished(self) -> str:
        if not self.unfinished:
            return ""
        unfinished = counted(self.unfinished, "record")
        return f"; {counted(self.kept, 'chunk')} kept for {unfinished} not finished yet"


def chunking_status(connection: Database, spec: JobSpec) -> ChunkingStatus | None:
    """The variant's chunked results and unfinished chunked records (with `chunking:` in the job, also
    its results sent whole); None when there is nothing to say."""
    results, chunks = quote(spec.output.results_table), quote(chunks_table(spec))
    if chunks_table(spec).lower() not in connection.table_names():
        return None
    parameters = {"variant": spec.variant}
    merged = connection.row(
        f"SELECT count(*) FILTER (WHERE chunks IS NOT NULL), "
        "coalesce(sum(CAST(chunks->>'chunks' AS BIGINT)), 0), count(*) FILTER (WHERE chunks IS NULL), "
        f"max(CAST(chunks->>'passes' AS INTEGER)) FROM {results} WHERE variant = $variant",
        parameters,
    )
    added = connection.rows(
        "SELECT CAST(e.key AS INTEGER), sum(e.value) FROM (SELECT unnest(map_entries(json_transform("
        """chunks, '{"added": "MAP(VARCHAR, BIGINT)"}').added)) AS e """
        f"FROM {results} WHERE variant = $variant AND chunks IS NOT NULL) GROUP BY 1 ORDER BY 1",
        parameters,
    )
    open_ = connection.row(
        f"SELECT count(DISTINCT c.record_id), count(*) FROM {chunks} c WHERE c.variant = $variant AND "
        f"NOT EXISTS (SELECT 1 FROM {results} r WHERE r.variant = $variant AND r.record_id = c.record_id)",
        parameters,
    )
    records, total, whole, stored_passes = merged or (0, 0, 0, None)
    unfinished, kept = (int(value) for value in open_ or (0, 0))
    job_chunks = spec.chunking is not None
    if not records and not unfinished and not (job_chunks and whole):
        return None
    passes = int(stored_passes or (spec.chunking.passes if spec.chunking else 1))
    found = {int(k): int(v) for k, v in added}
    by_pass = {number: found.get(number, 0) for number in range(1, passes + 1)} if records else {}
    return ChunkingStatus(
        int(records), int(total), by_pass, unfinished, kept, int(whole) if job_chunks else 0, passes
    )
