"""Each format's strings are accepted by the Pydantic type that names that format in its schema."""

from __future__ import annotations

import random
from datetime import date, datetime, time, timedelta
from ipaddress import IPv4Address, IPv4Interface, IPv4Network, IPv6Address, IPv6Interface, IPv6Network
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from pydantic import (
    UUID1,
    UUID3,
    UUID4,
    UUID5,
    AnyUrl,
    AwareDatetime,
    Base64Bytes,
    Base64Str,
    Base64UrlBytes,
    HttpUrl,
    IPvAnyAddress,
    IPvAnyInterface,
    IPvAnyNetwork,
    TypeAdapter,
)

from pipeline.sim.formats import formatted
from pipeline.sim.instances import WORDS

TYPES: list[Any] = [
    date,
    datetime,
    AwareDatetime,
    time,
    timedelta,
    AnyUrl,
    HttpUrl,
    UUID,
    UUID1,
    UUID3,
    UUID4,
    UUID5,
    IPv4Address,
    IPv6Address,
    IPvAnyAddress,
    IPv4Network,
    IPv6Network,
    IPvAnyNetwork,
    IPv4Interface,
    IPv6Interface,
    IPvAnyInterface,
    Base64Bytes,
    Base64Str,
    Base64UrlBytes,
    bytes,
    Path,
]


@pytest.mark.parametrize("kind", TYPES, ids=str)
def test_each_format_is_accepted_by_the_type_that_names_it(kind: Any) -> None:
    adapter = TypeAdapter(kind)
    name = adapter.json_schema()["format"]
    rng = random.Random(2)
    for _ in range(50):
        text = formatted(name, rng, WORDS)
        assert text is not None, name
        adapter.validate_json(f'"{text}"')  # as the pipeline reads an answer: from JSON


def test_every_uuid_version_is_the_version_named() -> None:
    rng = random.Random(3)
    for version in range(1, 9):
        assert UUID(formatted(f"uuid{version}", rng, WORDS)).version == version


def test_email_and_pattern_formats_have_their_shape() -> None:
    import re

    rng = random.Random(4)
    assert re.fullmatch(r"[a-z]+\.[a-z]+@example\.com", formatted("email", rng, WORDS) or "")
    assert re.fullmatch(
        r"[A-Z][a-z]+ <[a-z]+\.[a-z]+@example\.com>", formatted("name-email", rng, WORDS) or ""
    )
    re.compile(formatted("regex", rng, WORDS) or "(")


def test_a_format_not_known_here_gets_none() -> None:
    assert formatted("x-house-style", random.Random(5), WORDS) is None


def test_email_formats_pass_pydantic_s_own_check_where_it_is_installed() -> None:
    pytest.importorskip("email_validator")  # EmailStr's check: not a dependency of the pipeline
    from pydantic import EmailStr, NameEmail

    rng = random.Random(6)
    for kind in (EmailStr, NameEmail):
        adapter = TypeAdapter(kind)
        for _ in range(20):
            adapter.validate_python(formatted(adapter.json_schema()["format"], rng, WORDS))
