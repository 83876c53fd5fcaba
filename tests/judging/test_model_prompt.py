"""What a model judge is asked: one shared system message, the record and its numbered values, an
answer shaped for exactly one verdict per value, and the next request after a bad answer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from pipeline.errors import (
    ContextLengthError,
    InvalidJSONError,
    PermanentRecordError,
    RepetitionLoopError,
    TruncatedError,
)
from pipeline.job.spec import JobSpec, load_job
from pipeline.judging.model_prompt import (
    ANSWER_INSTRUCTION,
    Asking,
    JudgePrompts,
    field_guide,
    verdicts_model,
    verdicts_of,
)
from pipeline.quality.fields import schema_fields
from pipeline.quality.judgments import JudgmentVerdict, ValueToJudge, values_to_judge
from tests.support.processes import REPO

CORRECT, WRONG = JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG


@pytest.fixture(scope="module")
def linkedin() -> JobSpec:
    return load_job(REPO / "jobs" / "linkedin.yaml")


def example(spec: JobSpec) -> tuple[dict[str, str], list[ValueToJudge]]:
    """The job's first worked example: a posting and an answer to it."""
    path = spec.source_file.parent / "examples" / "linkedin.jsonl"
    first = orjson.loads(Path(path).read_text().splitlines()[0])
    return first["input"], values_to_judge(schema_fields(spec.schema_class), first["output"])


def test_the_answer_has_exactly_one_verdict_for_each_number() -> None:
    answer = verdicts_model(3)
    schema = answer.model_json_schema()
    assert list(schema["properties"]) == schema["required"] == ["1", "2", "3"]
    assert schema["additionalProperties"] is False
    assert {tuple(p["enum"]) for p in schema["properties"].values()} == {("correct", "wrong")}
    read = answer.model_validate({"2": "Wrong ", "1": "correct", "3": "CORRECT"})
    assert verdicts_of(read, 3) == [CORRECT, WRONG, CORRECT]  # by number, not by the order written
    for bad in ({"1": "correct", "2": "wrong"}, {"1": "correct", "2": "wrong", "3": "maybe"}):
        with pytest.raises(ValidationError):
            answer.model_validate(bad)
    with pytest.raises(ValidationError, match="Extra inputs"):
        answer.model_validate({"1": "correct", "2": "wrong", "3": "wrong", "4": "wrong"})


def test_a_request_is_the_shared_system_message_then_the_record_and_its_numbered_values(
    linkedin: JobSpec,
) -> None:
    texts, values = example(linkedin)
    prompts = JudgePrompts(linkedin.schema_class, linkedin.judge_settings())
    request = prompts.request_for(texts, values, structured=True)
    system, user = request.messages
    assert system is prompts.system_message  # the same for every record: one prefix for the cache
    assert system["content"].startswith(linkedin.judge.prompt) and system["content"].endswith(
        ANSWER_INSTRUCTION
    )
    lines = user["content"].splitlines()
    assert lines[:3] == ["The record:", "", "[title]"]
    assert "1. title: Senior Data Engineer" in lines
    assert f"{len(values)}. {values[-1].field}: {values[-1].value}" == lines[-1]
    assert '"text":"5+ years in data engineering"' in user["content"]  # an object of a list, one value
    assert request.max_tokens == linkedin.max_tokens
    assert request.response_format is not None
    schema = request.response_format["json_schema"]["schema"]
    assert len(schema["required"]) == len(values)
    assert prompts.request_for(texts, values, structured=False).response_format is None


def test_the_field_guide_says_what_each_judged_field_asks_for(linkedin: JobSpec) -> None:
    guide = field_guide(linkedin.schema_class).splitlines()
    assert "- salary.minimum: Lowest amount stated, as a number (35000, not '35k')." in guide
    assert any(line.startswith("- employment_type: One of: permanent, fixed-term contract") for line in guide)
    (requirements,) = [line for line in guide if line.startswith("- requirements:")]
    assert "each object judged as one value" in requirements and "kind: One of: skill" in requirements
    assert any(
        line.startswith("- explicit_skills: a list, each item judged as its own value.") for line in guide
    )
    assert "- education.mandatory" in guide  # no description: named all the same
    assert len(guide) == 24


@pytest.fixture
def asking(linkedin: JobSpec) -> Asking:
    settings = dataclasses.replace(linkedin.judge_settings(), max_tokens=300)
    prompts = JudgePrompts(linkedin.schema_class, settings)
    first = prompts.request_for({"title": "T"}, [ValueToJudge("title", "T", "T")], structured=True)
    return Asking(first, growth=2.0, ceiling=1000)


def test_a_bad_answer_is_asked_again_with_it_and_keeps_the_answers_shape(asking: Asking) -> None:
    asking.after_bad_answer(InvalidJSONError("not valid JSON", raw_output="nope"))
    request = asking.request
    assert [message["role"] for message in request.messages] == ["system", "user", "assistant", "user"]
    assert request.messages[2]["content"] == "nope"
    assert request.messages[3]["content"].startswith("Your previous reply was rejected: not valid JSON")
    assert request.response_format == asking.first.response_format is not None
    assert request.max_tokens == 300


def test_a_cut_off_answer_gets_a_larger_budget_up_to_the_ceiling(asking: Asking) -> None:
    asking.after_bad_answer(TruncatedError("cut off", raw_output='{"1": "corr'))
    assert (asking.request.max_tokens, asking.request.messages) == (600, asking.first.messages)
    asking.after_bad_answer(TruncatedError("cut off", raw_output='{"1": "corr'))
    assert asking.request.max_tokens == 1000
    looped = '{"1": "correct", ' + '"1": "correct", ' * 20
    unit = '"1": "correct", '
    asking.after_bad_answer(RepetitionLoopError("loop", raw_output=looped, unit=unit, loop_start=1))
    assert asking.request.sampling and asking.request.max_tokens == 1000  # asked shorter, with penalties
    assert asking.request.response_format == asking.first.response_format


def test_a_context_refusal_fits_the_budget_or_fails_for_good(asking: Asking) -> None:
    asking.after_context_refused(
        ContextLengthError("past the context", context_length=1000, prompt_tokens=900)
    )
    assert asking.request.max_tokens == 100
    for tokens, at_least in ((1200, False), (900, True), (None, False)):
        refused = ContextLengthError(
            "past", context_length=1000, prompt_tokens=tokens, prompt_at_least=at_least
        )
        with pytest.raises(PermanentRecordError, match="do not fit the judge's context: past") as raised:
            asking.after_context_refused(refused)
        assert type(raised.value) is PermanentRecordError  # not retried
