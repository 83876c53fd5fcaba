"""Skill and knowledge mentions in one job-posting sentence, as SkillSpan annotates them.

SkillSpan (Zhang et al., NAACL 2022) marks two kinds of span: a **skill** is what a person can do, a
**knowledge** component is what a person knows. The answers are scored against its gold spans, which are
copied from the sentence; so the field descriptions (part of the prompt) ask for verbatim copies, and
both fields are marked ``grounded``: every value must be found in the record's text.

Lists and items are bounded (a sentence of SkillSpan holds at most 15 spans, the longest ~140
characters), so a model that starts repeating itself is made to close the JSON.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

Span = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]


class SkillMentions(BaseModel):
    """The skills and the knowledge one sentence asks of a candidate, each copied from the sentence."""

    model_config = ConfigDict(extra="forbid")

    skills: list[Span] = Field(
        max_length=40,
        description="What a person can DO: abilities, tasks and personal qualities the sentence asks for, "
        "often verb phrases ('work in a team', 'manage budgets', 'communicate with stakeholders') or "
        "single qualities ('motivated', 'leadership'). Copy each span verbatim from the sentence, spaces "
        "around punctuation included; start at the verb or quality, leaving out lead-ins such as "
        "'experience in', 'ability to' or 'you will'. In order of appearance, each once; [] if none.",
        json_schema_extra={"grounded": True},
    )
    knowledge: list[Span] = Field(
        max_length=40,
        description="What a person KNOWS: subjects, fields, tools, technologies, languages, methods and "
        "qualifications, usually noun phrases ('machine learning', 'Python', 'property law', "
        "'degree in economics'). Copy each span verbatim from the sentence, as short as still names "
        "the whole thing; a tool named inside a skill phrase is listed here too. In order of "
        "appearance, each once; [] if none.",
        json_schema_extra={"grounded": True},
    )

    @field_validator("skills", "knowledge")
    @classmethod
    def _each_once(cls, spans: list[str]) -> list[str]:
        # Exact duplicates only: spans are verbatim copies, so 'Python' and 'python' are two mentions.
        return list(dict.fromkeys(spans))


class DocumentSkillMentions(SkillMentions):
    """The same mentions for a whole document of many sentences (``benchmarks/long_documents.py``): a
    long document is extracted in chunks and their lists merged (``chunking:``), and the merged lists
    hold every chunk's, so they have room for a document's worth. A chunk's answer still ends within
    max_tokens: a longer one is cut off (and a loop in it re-asked), not stored."""

    skills: list[Span] = Field(
        max_length=400,
        description=SkillMentions.model_fields["skills"].description,
        json_schema_extra={"grounded": True},
    )
    knowledge: list[Span] = Field(
        max_length=400,
        description=SkillMentions.model_fields["knowledge"].description,
        json_schema_extra={"grounded": True},
    )
