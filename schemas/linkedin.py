"""Structured extraction of one job posting.

Field descriptions are part of the prompt (the JSON schema is appended to the system prompt), so they
are written as instructions to the model. Validators clean what is safe to clean (duplicate skills,
whitespace) and reject what needs the model's attention (a salary range upside down).

Every list and string has an upper bound. Constrained decoding enforces them, so a model that starts
repeating itself is made to close the JSON instead of spending the whole token budget on one record:
the longest answer the bounds allow, written compactly as constrained decoding writes it, is under
14,000 characters (2,400 tokens of English for SmolLM2's tokenizer, under 4,000 even at 3.5 characters
a token), inside the LinkedIn job's max_tokens of 4,096.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.config import JsonDict

ShortText = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
# A list item that is a term, not a sentence: a skill, a capability, a benefit, a subject.
Term = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=80)]
Name = Annotated[str, StringConstraints(strip_whitespace=True, max_length=200)]

# Values quoted from the posting: after extraction each is looked for in the text (pipeline.quality),
# and one the text does not contain is flagged for review.
GROUNDED: JsonDict = {"grounded": True}

Seniority = Literal[
    "Intern", "Apprentice", "Graduate", "Entry level", "Junior", "Mid-level", "Senior", "Lead",
    "Principal", "Staff", "Manager", "Senior Manager", "Head of", "Director", "Vice President",
    "C-level", "Unspecified",
]  # fmt: skip


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def unique_case_insensitive(items: list[str]) -> list[str]:
    """Keep the first spelling of each item, in order."""
    seen: set[str] = set()
    kept = []
    for item in items:
        key = " ".join(item.casefold().split())
        if key and key not in seen:
            seen.add(key)
            kept.append(item)
    return kept


class Salary(_Strict):
    minimum: float | None = Field(
        None, ge=0, description="Lowest amount stated, as a number (35000, not '35k')."
    )
    maximum: float | None = Field(
        None, ge=0, description="Highest amount stated; equal to minimum if one figure."
    )
    currency: str = Field("GBP", pattern=r"^[A-Z]{3}$", description="ISO 4217 code, e.g. GBP, EUR, USD.")
    period: Literal["hour", "day", "week", "month", "year"] = Field(
        "year", description="What the amount is paid per."
    )
    text: Name | None = Field(
        None, description="The salary exactly as written in the posting.", json_schema_extra=GROUNDED
    )

    @model_validator(mode="after")
    def _range_in_order(self) -> Salary:
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError("salary minimum is larger than maximum")
        return self


class ExperienceYears(_Strict):
    minimum: int | None = Field(None, ge=0, le=50, description="Fewest years of experience asked for.")
    maximum: int | None = Field(None, ge=0, le=50, description="Most years mentioned, if a range is given.")

    @model_validator(mode="after")
    def _range_in_order(self) -> ExperienceYears:
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError("experience minimum is larger than maximum")
        return self


class Requirement(_Strict):
    text: ShortText = Field(
        description="ONE atomic requirement in a short phrase, e.g. 'Python', '5+ years in retail "
        "banking', 'full UK driving licence'. Split 'X and Y' into two items."
    )
    kind: Literal["skill", "experience", "education", "certification", "language", "legal", "other"]
    mandatory: bool = Field(
        description="false if the posting says desirable, nice to have, a plus or preferred."
    )


class Education(_Strict):
    level: Literal[
        "none",
        "GCSE",
        "A-level",
        "vocational",
        "bachelor",
        "master",
        "doctorate",
        "professional",
        "unspecified",
    ] = Field(description="Lowest level the posting asks for; 'unspecified' if it does not say.")
    fields: list[Term] = Field(
        default_factory=list, max_length=5, description="Subjects named, e.g. 'Engineering'."
    )
    mandatory: bool = True


class JobPosting(_Strict):
    """Everything a job seeker or a labour-market analyst wants from one posting."""

    title: ShortText = Field(description="The job title, cleaned: no location, salary or reference numbers.")
    company: Name | None = Field(
        None, description="The hiring company; null if only an agency is named.", json_schema_extra=GROUNDED
    )
    recruiter: Name | None = Field(
        None, description="The recruitment agency, if the posting is by one.", json_schema_extra=GROUNDED
    )
    location: Name | None = Field(None, description="Town or city and region, e.g. 'Leeds, West Yorkshire'.")
    remote_policy: Literal["onsite", "hybrid", "remote", "unspecified"] = Field(
        description="Where the work happens, as the posting states it."
    )
    employment_type: Literal[
        "permanent",
        "fixed-term contract",
        "contract",
        "temporary",
        "internship",
        "apprenticeship",
        "unspecified",
    ]
    working_time: Literal["full-time", "part-time", "unspecified"]
    seniority: Seniority = Field(
        description="The most specific level that fits: 'Director' or 'Head of' rather than 'Senior' "
        "when the role leads a function; 'Unspecified' only if nothing indicates a level."
    )
    manages_people: bool = Field(description="true if the role has direct reports or leads a team.")
    explicit_skills: list[Term] = Field(
        max_length=30,
        description="Skills, tools and technologies the posting names, each once, as short terms "
        "('SQL', 'stakeholder management').",
        json_schema_extra=GROUNDED,
    )
    inferred_capabilities: list[Term] = Field(
        max_length=12,
        description="Capabilities the role clearly needs but the posting does not name, inferred from "
        "the duties (e.g. 'budget ownership' for a role that 'manages a £2m budget').",
    )
    requirements: list[Requirement] = Field(
        max_length=25, description="Every requirement, atomised: one item each."
    )
    experience_years: ExperienceYears | None = Field(None, description="null if no number of years is given.")
    education: Education | None = Field(None, description="null if the posting says nothing about education.")
    salary: Salary | None = Field(None, description="null if no pay is stated (not 'competitive').")
    benefits: list[Term] = Field(
        default_factory=list, max_length=15, description="Benefits named, e.g. 'pension'."
    )
    culture_signals: list[Term] = Field(
        default_factory=list,
        max_length=10,
        description="What the posting says about how the team works: pace, values, flexibility, "
        "autonomy, hierarchy ('fast-paced start-up', 'flexible hours', 'collaborative').",
    )

    @field_validator("explicit_skills", "inferred_capabilities", "benefits", "culture_signals")
    @classmethod
    def _deduplicated(cls, items: list[str]) -> list[str]:
        return unique_case_insensitive(items)
