"""The job spec (``jobs/*.yaml``): load, interpolate ``${VAR}``, validate, resolve the schema class.

Every problem becomes one :class:`ConfigError` line naming the file and the key at fault, raised
before any request is sent.
"""

from __future__ import annotations

import os
import re
import string
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pipeline.errors import ConfigError
from pipeline.job.chunking import ChunkingSpec, check_chunk_field, checked_merges
from pipeline.job.examples import Example, check_examples, read_examples_file
from pipeline.job.judge import JudgeSettings, JudgeSpec, ReasoningEffort, resolve_judge
from pipeline.job.schema import resolve_schema
from pipeline.job.text import (
    IDENTIFIER,
    describe_validation_error,
    interpolate,
    one_line,
)
from pipeline.job.variants import (
    MAIN_VARIANT as MAIN_VARIANT,  # defined with the variant names; its readers import it from here
)
from pipeline.job.variants import (
    VARIANT_NAME_RULE,
    VariantName,
    VariantSpec,
    is_variant_name,
    merge_changes,
    rerun_of,
    variant_changes,
)
from pipeline.servers.config import (
    LOCAL_ENDPOINT,
    LOCAL_MODEL,
    Concurrency,
    ContextLength,
    EndpointConfig,
    EndpointEntry,
    EndpointSpec,
    checked_listen_host,
    resolve_endpoints,
)

SqlName = Annotated[str, Field(pattern=IDENTIFIER.pattern, max_length=128)]
# The variable names of ``${VAR}`` / ``${VAR:-default}`` (interpolated by pipeline.job.text).
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceSpec(_Strict):
    """Where records come from: a table (or a SELECT) in the job's DuckDB database."""

    table: SqlName | None = None
    query: str | None = None
    id_column: SqlName = "id"
    fields: list[SqlName] = Field(min_length=1)
    seed_file: Path | None = None
    batch_size: int = Field(default=1000, ge=1, le=100_000)

    @model_validator(mode="after")
    def _exactly_one_origin(self) -> SourceSpec:
        if (self.table is None) == (self.query is None):
            raise ValueError("give exactly one of 'table' or 'query'")
        if self.seed_file is not None and self.table is None:
            raise ValueError("'seed_file' needs 'table' (the table it is loaded into)")
        return self


class PromptSpec(_Strict):
    """A static system prompt (shared prefix, so vLLM's prefix cache hits) and a per-record template.

    Few-shot ``examples`` (or an ``examples_file`` of JSON lines) are sent as user/assistant turns
    right after the system prompt, so they belong to the shared prefix too."""

    system: str = Field(min_length=1)
    user: str = Field(min_length=1)
    include_schema: bool = True
    examples: list[Example] = Field(default_factory=list, max_length=50)
    examples_file: Path | None = None

    @model_validator(mode="after")
    def _one_source_of_examples(self) -> PromptSpec:
        if self.examples and self.examples_file is not None:
            raise ValueError("give 'examples' or 'examples_file', not both")
        return self


class RetrySpec(_Strict):
    transient_retries: int = Field(default=6, ge=0, le=100)
    reasks: int = Field(default=2, ge=0, le=20)
    truncation_retries: int = Field(default=2, ge=0, le=10)
    truncation_growth: float = Field(default=2.0, ge=1.0, le=16.0)
    max_tokens_ceiling: int | None = Field(default=None, ge=1)
    backoff_initial_s: float = Field(default=2.0, gt=0)
    backoff_max_s: float = Field(default=120.0, gt=0)
    abort_after_consecutive_failures: int = Field(default=50, ge=1)


class OperationsSpec(_Strict):
    """How an unattended run stops, notices a stall, and waits out a server restart."""

    shutdown_grace_s: float = Field(default=60.0, ge=0)
    stall_warning_s: float = Field(default=600.0, gt=0)
    stall_abort_s: float | None = Field(default=None, gt=0)
    server_down_abort_s: float = Field(default=1800.0, gt=0)
    preflight_timeout_s: float = Field(default=10.0, gt=0)
    # How often a running job refreshes the copy that readers (status, export, eval, ...) read while it
    # holds the database; a reader that finds it older than a few seconds asks for a new one too.
    snapshot_interval_s: float = Field(default=60.0, gt=0)
    # Where --metrics-port listens. The metrics have no authentication: loopback unless asked.
    metrics_host: Annotated[str, AfterValidator(checked_listen_host)] = "127.0.0.1"

    @model_validator(mode="after")
    def _abort_after_warning(self) -> OperationsSpec:
        if self.stall_abort_s is not None and self.stall_abort_s < self.stall_warning_s:
            raise ValueError("'stall_abort_s' must not be below 'stall_warning_s'")
        return self


class OutputSpec(_Strict):
    results_table: SqlName = "results"
    failures_table: SqlName = "failures"
    runs_table: SqlName = "runs"


class JobSpec(_Strict):
    """One extraction job. Paths are relative to the job file's directory."""

    name: SqlName
    database: Path
    source: SourceSpec
    prompt: PromptSpec
    schema_path: str = Field(alias="schema", pattern=r"^[\w.]+:\w+$")
    model: str = Field(min_length=1)
    endpoint: EndpointSpec = EndpointSpec()
    endpoints: list[EndpointEntry] = Field(default_factory=list, max_length=64)
    concurrency: Concurrency = 256
    max_concurrency: int = Field(default=512, ge=1, le=8192)
    request_timeout_s: float = Field(default=900.0, gt=0)
    max_tokens: int = Field(default=4096, ge=1)
    # The servers' context length, when their /v1/models does not list it (or lists it wrongly).
    max_model_len: ContextLength | None = None
    reasoning_effort: ReasoningEffort | None = "low"
    temperature: float | None = Field(default=0.0, ge=0.0, le=2.0)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    # DuckDB's buffer pool; unset (None), the database's own default: source/db.py decides it
    # (DEFAULT_MEMORY_LIMIT), where the database is opened, since the job sits below the source layer.
    duckdb_memory_limit: str | None = Field(
        default=None, pattern=r"^\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)$"
    )
    retry: RetrySpec = RetrySpec()
    operations: OperationsSpec = OperationsSpec()
    output: OutputSpec = OutputSpec()
    variants: dict[VariantName, VariantSpec] = Field(default_factory=dict)
    chunking: ChunkingSpec | None = None  # a record whose long field does not fit: split, merged
    judge: JudgeSpec = JudgeSpec()  # the model that judges a sample's values (pipeline.judging.model)
    source_file: Path = Field(default=Path("<memory>"), exclude=True)
    # Which variant's results this spec reads and writes (``main``: the job as written).
    variant: str = Field(default=MAIN_VARIANT, exclude=True)
    # The keys command-line options set (with_overrides): an error about one names the option typed.
    overridden: frozenset[str] = Field(default=frozenset(), exclude=True)

    @field_validator("duckdb_memory_limit", mode="before")
    @classmethod
    def _memory_limit_written_out(cls, value: object) -> object:
        """None stands for "not given"; a job file that writes null gets the error it always got."""
        if value is None:
            raise PydanticCustomError("string_type", "Input should be a valid string")
        return value

    @model_validator(mode="after")
    def _template_uses_known_fields(self) -> JobSpec:
        unknown = sorted(set(template_fields(self.prompt.user)) - set(self.source.fields))
        if unknown:
            raise ValueError(f"prompt.user uses {unknown} which are not in source.fields")
        if MAIN_VARIANT in self.variants:
            raise ValueError(f"variants: '{MAIN_VARIANT}' is the job itself; give the variant another name")
        check_chunk_field(self.chunking, self.content_fields())
        self._check_endpoints()
        return self

    def _check_endpoints(self) -> None:
        if self.endpoints and self.endpoint.base_url is not None:
            raise ValueError(
                "give endpoint.base_url (one server) or endpoints (several), not both; with endpoints, "
                "endpoint holds the defaults they share (api_key_env, structured_output)"
            )
        if not self.endpoints and self.endpoint.base_url is None:
            raise ValueError("endpoint.base_url is missing (or list the servers under endpoints)")
        urls = [entry.base_url for entry in self.endpoints]
        if len(set(urls)) < len(urls):
            raise ValueError("endpoints: the same base_url is listed twice")

    def endpoint_configs(self) -> list[EndpointConfig]:
        """Every server of the run, with its model, concurrency and key."""
        return resolve_endpoints(
            self.endpoint,
            self.endpoints,
            model=self.model,
            concurrency=self.concurrency,
            max_concurrency=self.max_concurrency,
            max_model_len=self.max_model_len,
        )

    def judge_settings(self, model: str | None = None, base_url: str | None = None) -> JudgeSettings:
        """The model judge as ``judge:`` asks for it, each key it leaves out the job's own; ``model``,
        ``base_url``: another judge model, on another server (``judge --judge-model``, ``--endpoint``),
        resolved as if ``judge:`` named them (a URL checked as the job file's are)."""
        judge = self.judge
        if model is not None or base_url is not None:
            given = judge.model_dump(exclude_unset=True)
            if model is not None:
                given["model"] = model
            if base_url is not None:
                given["endpoint"] = {**given.get("endpoint", {}), "base_url": base_url}
            try:
                judge = JudgeSpec.model_validate(given)
            except ValidationError as exc:
                raise ConfigError(f"the judge's {describe_validation_error(exc, JudgeSpec)}") from exc
        return resolve_judge(
            judge,
            self.endpoint_configs()[0],
            job_model=self.model,
            max_tokens=self.max_tokens,
            reasoning_effort=self.reasoning_effort,
        )

    @cached_property
    def schema_class(self) -> type[BaseModel]:
        return resolve_schema(self.schema_path, self.source_file)

    @property
    def max_tokens_ceiling(self) -> int:
        return self.retry.max_tokens_ceiling or self.max_tokens * 4

    def api_key(self, variable: str | None = None) -> str | None:
        """The key from the environment variable the spec (or an endpoint: ``variable``) names, if set.

        A vLLM server started without ``--api-key`` accepts any key, so an unset variable is not an
        error until the server refuses the request (the 401 message then names the variable).
        """
        name = variable or self.endpoint.api_key_env
        if name is None:
            return None
        return os.environ.get(name) or None

    def with_overrides(self, **changes: Any) -> JobSpec:
        """A copy with command-line overrides applied (``None`` means "keep the spec's value"),
        checked exactly as the job file is: a bad value is a :class:`ConfigError` naming its key."""
        updates = {key: value for key, value in changes.items() if value is not None}
        if not updates:
            return self
        nested = {"base_url": "endpoint", **dict.fromkeys(OperationsSpec.model_fields, "operations")}
        data = self._as_data()
        if "base_url" in updates:  # --endpoint: one server, instead of the job's list
            data["endpoints"] = []
        if "concurrency" in updates:  # --concurrency: for every server
            data["endpoints"] = [{**entry, "concurrency": None} for entry in data.get("endpoints", [])]
        for key, value in updates.items():
            if key in nested:
                data[nested[key]] = {**data.get(nested[key], {}), key: value}
            elif key == "prompt":
                data = merge_changes(data, {"prompt": value})
            else:
                data[key] = value
        spec = self._rebuilt(data, f"{self.source_file} with the command-line options")
        return spec.model_copy(update={"overridden": self.overridden | updates.keys()})

    def said_of(self, key: str) -> str:
        """Where the value of top-level ``key`` was given, as an error about it says first: the option
        typed (``--model x``), else the key of the variant that sets it, else the job file's key."""
        if key in self.overridden and key in _OPTIONS:
            return f"{_OPTIONS[key]} {getattr(self, key)}"
        declared = self.variants.get(rerun_of(self.variant) or self.variant)
        if declared is not None and key in variant_changes(declared):
            return f"{self.source_file}: key 'variants.{rerun_of(self.variant) or self.variant}.{key}'"
        return f"{self.source_file}: key '{key}'"

    @property
    def runs_locally(self) -> bool:
        """Whether a run of this job starts the bundled local vLLM server (``endpoint.base_url: local``;
        with ``endpoints:`` it never does). The one place that decides it: the CLI, ``run_job_sync``,
        ``run_job`` and the fleet ask here."""
        return self.endpoint.is_local

    def as_run(self, *, local: bool = False) -> JobSpec:
        """The job as a run makes it: with ``local`` (``--local``) or ``endpoint.base_url: local``, on
        the bundled vLLM server with the model that serves, whatever model the job names."""
        if not (local or self.runs_locally):
            return self
        bundled = self.with_overrides(base_url=LOCAL_ENDPOINT, model=LOCAL_MODEL)
        return bundled.model_copy(update={"overridden": self.overridden})  # --local's model, not --model's

    def for_variant(self, name: str) -> JobSpec:
        """The job as variant ``name`` makes it: a declared variant's changes applied, or (for a name
        the job does not declare) the job's own settings, its results kept apart under that name."""
        if name == self.variant:
            return self
        if not is_variant_name(name):
            raise ConfigError(f"variant {name!r}: a variant name has {VARIANT_NAME_RULE}")
        rerun = rerun_of(name)
        if rerun is not None:  # the variant it re-runs, exactly, its results stored apart
            return self.for_variant(rerun).model_copy(update={"variant": name})
        declared = self.variants.get(name)
        data = self._as_data()
        if declared is not None:
            data = merge_changes(data, variant_changes(declared))
        key = f"variants.{name}" if declared else ""
        where = f"{self.source_file}: key '{key}'" if declared else str(self.source_file)
        return self._rebuilt(data, where, f"{key}." if key else "").model_copy(update={"variant": name})

    def _as_data(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_unset=True, exclude={"source_file", "variant"})

    def _rebuilt(self, data: dict[str, Any], where: str, key_prefix: str = "") -> JobSpec:
        try:
            spec = JobSpec.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"{where}: {describe_validation_error(exc, JobSpec)}") from exc
        kept = {"source_file": self.source_file, "variant": self.variant, "overridden": self.overridden}
        spec = spec.model_copy(update=kept)
        return checked_examples(_resolve_paths(spec, self.source_file.resolve().parent), key_prefix)

    # Not cached: model_copy() would carry a cached value over to a copy with other settings.
    def content_fields(self) -> tuple[str, ...]:
        """The source fields the user template reads, in order, each once: the record's content."""
        return tuple(dict.fromkeys(template_fields(self.prompt.user)))


# The command-line option that sets a top-level key, for JobSpec.said_of.
_OPTIONS = {"model": "--model"}


def template_fields(template: str) -> list[str]:
    """The ``{name}`` placeholders of a user template; attribute or index access is refused."""
    names = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if not IDENTIFIER.match(name) or spec or conversion:
            raise ValueError(f"prompt.user placeholder {{{name}}} must be a plain field name")
        names.append(name)
    return names


def load_job(path: str | Path) -> JobSpec:
    """Read, interpolate and validate a job file; resolve its schema class. Raises :class:`ConfigError`."""
    job_file = Path(path)
    try:
        text = job_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{job_file}: cannot read job file ({exc.strerror or exc})") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{job_file}: not valid YAML ({one_line(str(exc))})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{job_file}: expected a mapping of keys at the top level")
    data = interpolate(raw, job_file, ())
    for internal in ("source_file", "variant"):
        if internal in data:
            raise ConfigError(f"{job_file}: key '{internal}': unknown key")
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        where = _from_environment(raw, exc)
        raise ConfigError(f"{job_file}: {describe_validation_error(exc, JobSpec)}{where}") from exc
    spec = _resolve_paths(spec.model_copy(update={"source_file": job_file}), job_file.resolve().parent)
    checked_merges(spec.schema_class, f"{job_file}: key 'schema'")  # resolves it: a bad path fails now
    spec = checked_examples(spec)
    for name in spec.variants:
        spec.for_variant(name)  # each variant is checked now too, as the whole job it makes
    return spec


def _from_environment(raw: dict[str, Any], exc: ValidationError) -> str:
    """Which environment variables the refused values came from (``${VAR}`` in the job file), so the
    message names what to fix: the variable, not the file."""
    notes = []
    for error in exc.errors(include_url=False)[:5]:
        value: Any = raw
        for part in error["loc"]:
            value = value.get(part) if isinstance(value, dict) else None
        names = _VARIABLE.findall(value) if isinstance(value, str) else []
        if names:
            variables = ", ".join(dict.fromkeys(names))
            noun = "variable" if len(set(names)) == 1 else "variables"
            notes.append(f"'{'.'.join(map(str, error['loc']))}' comes from environment {noun} {variables}")
    return "".join(f"; {note}" for note in notes)


def checked_examples(spec: JobSpec, key_prefix: str = "") -> JobSpec:
    """Read ``prompt.examples_file`` into ``prompt.examples`` and check every example."""
    prompt = spec.prompt
    key = f"{key_prefix}prompt.examples"
    if prompt.examples_file is not None:
        key = f"{key_prefix}prompt.examples_file"
        examples = read_examples_file(prompt.examples_file, f"{spec.source_file}: key '{key}'")
        # The examples are what counts (and what the version hashes); the file has been read.
        prompt = prompt.model_copy(update={"examples": examples, "examples_file": None})
    check_examples(
        prompt.examples,
        spec.schema_class,
        template_fields=spec.content_fields(),
        source_fields=spec.source.fields,
        where=f"{spec.source_file}: key '{key}'",
    )
    return spec.model_copy(update={"prompt": prompt})


def _resolve_paths(spec: JobSpec, base: Path) -> JobSpec:
    source, prompt = spec.source, spec.prompt
    if source.seed_file is not None and not source.seed_file.is_absolute():
        source = source.model_copy(update={"seed_file": (base / source.seed_file).resolve()})
    if prompt.examples_file is not None and not prompt.examples_file.is_absolute():
        prompt = prompt.model_copy(update={"examples_file": (base / prompt.examples_file).resolve()})
    database = (spec.database if spec.database.is_absolute() else base / spec.database).resolve()
    return spec.model_copy(update={"database": database, "source": source, "prompt": prompt})
