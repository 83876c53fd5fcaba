"""The ``judge:`` section of a job: the model that judges the extracted values of a sample
(:mod:`pipeline.judging.model`), where it is served and how it is asked.

Every key left out is the job's own: the job's (first) server, its model, max_tokens, concurrency and
reasoning_effort; timeouts, temperature and ``extra_body`` always are. So a job judged by the model
that extracted it needs no ``judge:`` at all, and one judged by a larger model names only that::

    judge:
      model: openai/gpt-oss-120b
      endpoint: {base_url: http://gpu-box:8000/v1}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.job.commands import command
from pipeline.servers.config import LOCAL_ENDPOINT, EndpointConfig, EndpointSpec

ReasoningEffort = Literal["minimal", "low", "medium", "high"]

#: What the judge is told, first in every request (a shared prefix: vLLM's prefix cache serves it once).
#: The field descriptions of the job's schema and the answer's shape follow it (pipeline.judging).
DEFAULT_JUDGE_PROMPT = """\
You check the values a model extracted from one record. For each numbered value, decide whether it is \
correct for this record: stated or clearly implied by the record's text, and what its field asks for \
(the field descriptions below say what each field asks for).
A value is wrong when the text neither states nor clearly implies it, when it misstates the text (a \
wrong name, number, unit or period), or when it is not what its field asks for (it belongs in another \
field, or breaks the field's description).
Judge each value on its own: a right value is correct even when other values are wrong or missing.
Answer every number with "correct" or "wrong"."""


class JudgeSpec(BaseModel):
    """``judge:``: each key defaults to the job's own (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: EndpointSpec | None = None
    model: str | None = Field(default=None, min_length=1)
    prompt: str = Field(default=DEFAULT_JUDGE_PROMPT, min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1, le=8192)
    # Left out: the job's. Given as null: none is sent (a server that is not a reasoning model).
    reasoning_effort: ReasoningEffort | None = None

    @field_validator("endpoint")
    @classmethod
    def _served(cls, endpoint: EndpointSpec | None) -> EndpointSpec | None:
        if endpoint is not None and endpoint.is_local:
            raise ValueError(
                f"base_url '{LOCAL_ENDPOINT}' is not served while judging: give the URL of a running "
                f"server (`{command('serve-local')}` prints one)"
            )
        return endpoint


@dataclass(frozen=True, slots=True)
class JudgeSettings:
    """The judge as it is asked: its server (its URL, model and concurrency), prompt and budgets."""

    endpoint: EndpointConfig
    prompt: str
    max_tokens: int
    reasoning_effort: str | None

    @property
    def model(self) -> str:
        return self.endpoint.model


def resolve_judge(
    judge: JudgeSpec,
    job_server: EndpointConfig,
    *,
    job_model: str,
    max_tokens: int,
    reasoning_effort: str | None,
) -> JudgeSettings:
    """``judge`` with what it leaves out taken from the job: its first server ``job_server`` (and, on
    that server, the model it serves there), ``job_model`` elsewhere, ``max_tokens``, ``reasoning_effort``."""
    given = judge.endpoint.model_fields_set if judge.endpoint is not None else set()
    own = judge.endpoint or EndpointSpec()
    base_url = own.base_url if "base_url" in given and own.base_url else job_server.base_url
    same_server = base_url == job_server.base_url
    server = EndpointConfig(
        base_url=base_url,
        model=judge.model or (job_server.model if same_server else job_model),
        concurrency=judge.concurrency or job_server.most_in_flight,
        max_concurrency=judge.concurrency or job_server.most_in_flight,
        api_key_env=own.api_key_env if "api_key_env" in given else job_server.api_key_env,
        structured_output=own.structured_output
        if "structured_output" in given
        else job_server.structured_output,
        max_model_len=own.max_model_len or (job_server.max_model_len if same_server else None),
    )
    effort = judge.reasoning_effort if "reasoning_effort" in judge.model_fields_set else reasoning_effort
    return JudgeSettings(server, judge.prompt, judge.max_tokens or max_tokens, effort)
