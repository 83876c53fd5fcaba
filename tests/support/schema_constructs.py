"""A schema with one field for each construct Pydantic's JSON schemas have: what a user's own schema may
hold, and what the simulator's answers must satisfy (tests/sim/test_instances.py, test_answers.py)."""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum, IntEnum
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    UUID4,
    AfterValidator,
    AnyUrl,
    AwareDatetime,
    Base64Bytes,
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    HttpUrl,
    IPvAnyAddress,
    IPvAnyInterface,
    IPvAnyNetwork,
    Json,
    SecretStr,
    StringConstraints,
    condecimal,
    confloat,
    conint,
    conlist,
    constr,
)

# EmailStr needs the email-validator package, which the pipeline does not install: the format's
# check here is the shape every e-mail address has (one @, a dot in the domain, no spaces).
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}")


def _an_email(value: str) -> str:
    if not _EMAIL.fullmatch(value):
        raise ValueError(f"not an e-mail address: {value!r}")
    return value


Email = Annotated[str, Field(json_schema_extra={"format": "email"}), AfterValidator(_an_email)]


class Colour(Enum):
    RED = "red"
    GREEN = "green"


class Size(Enum):
    SMALL = 1
    LARGE = 2


class Level(IntEnum):
    LOW = 1
    MEDIUM = 2
    HIGH = 3


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(9, ge=1, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool = True


class Node(BaseModel):
    """A recursive model: a tree, and a chain up."""

    name: str
    children: list[Node] = []
    parent: Node | None = None


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")

    street: str
    city: str | None = None
    postcode: str = Field(pattern=r"^[A-Z]{1,2}\d{1,2} \d[A-Z]{2}$")


class EveryConstruct(BaseModel):
    # Python's re, not Rust's regex, checks the patterns: the lookahead below needs it.
    model_config = ConfigDict(extra="forbid", regex_engine="python-re")

    # formats
    day: date
    moment: datetime
    aware: AwareDatetime
    clock: time
    span: timedelta
    email: Email
    url: AnyUrl
    http_url: HttpUrl
    ident: UUID
    ident4: UUID4
    ip4: IPv4Address
    ip6: IPv6Address
    any_ip: IPvAnyAddress
    network: IPvAnyNetwork
    interface: IPvAnyInterface
    path: Path
    secret: SecretStr
    payload: Base64Bytes
    raw: bytes
    embedded: Json[list[int]]
    unknown_format: Annotated[str, Field(json_schema_extra={"format": "x-house-style"})]
    # patterns and lengths
    code: Annotated[str, Field(pattern=r"^[A-Z]{3}-\d{2,4}$")]
    sized: constr(min_length=5, max_length=8, pattern=r"^[a-z]+$")  # type: ignore[valid-type]  # the con*() call form, as older schemas write it
    short: Annotated[str, StringConstraints(max_length=3)]
    long: Annotated[str, Field(min_length=80)]
    lookahead: Annotated[str, Field(pattern=r"^(?=.*\d)[a-z0-9]{6,10}$")]
    # numbers
    count: int
    ratio: float
    bounded: conint(ge=3, le=7, multiple_of=2)  # type: ignore[valid-type]  # the con*() call form, as older schemas write it
    open_interval: confloat(gt=0, lt=1)  # type: ignore[valid-type]  # the con*() call form, as older schemas write it
    stepped: Annotated[float, Field(multiple_of=0.25, gt=1)]
    score: Annotated[int, Field(ge=10, le=20)]
    negative: Annotated[int, Field(lt=0)]
    money: Decimal
    price: condecimal(max_digits=6, decimal_places=2, ge=0)  # type: ignore[valid-type]  # the con*() call form, as older schemas write it
    size: ByteSize
    # enums and literals
    colour: Colour
    size_enum: Size
    level: Level
    kind: Literal["a", "b"]
    one: Literal[1]
    maybe_literal: Literal["x"] | None = None
    # unions
    optional: int | None
    either: int | str
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]
    # arrays
    tags: list[str]
    few: conlist(int, min_length=2, max_length=4)  # type: ignore[valid-type]  # the con*() call form, as older schemas write it
    unique: set[int]
    frozen: frozenset[str]
    point: tuple[float, float]
    triple: tuple[str, int, bool]
    many: tuple[int, ...]
    grid: list[list[int]]
    addresses: list[Address]
    litters: list[list[Cat]]
    # dicts
    counts: dict[str, int]
    by_number: dict[int, str]
    by_key: dict[Literal["a", "b"], float]
    by_day: dict[date, int]
    by_code: dict[Annotated[str, Field(pattern=r"^k\d$")], int]
    bounded_dict: dict[str, int] = Field(min_length=1, max_length=2)
    anything: Any
    loose: dict[str, Any]
    # models, plain types and defaults
    address: Address
    tree: Node
    flag: bool
    nothing: None
    with_default: str = "x"


class TypedColumns(BaseModel):
    """A field of each type `export --flatten` gives a column of that type (tests/reports/test_export.py),
    most of them optional: ``X | None`` is an X column with nulls."""

    day: date | None
    moment: datetime
    aware: AwareDatetime | None
    clock: time
    price: condecimal(max_digits=6, decimal_places=2)  # type: ignore[valid-type]  # the con*() call form, as older schemas write it
    amount: Decimal | None
    colour: Colour | None
    level: Level
    one: Literal[1, 2]
    kind: Literal["a", "b"] | None
    days: list[date] | None
    counts: list[int] | None
    ident: UUID
    span: timedelta
    anything: dict[str, int]
