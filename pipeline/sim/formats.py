"""Strings for a JSON schema's ``format``: what Pydantic names in the schemas it emits (dates and times,
e-mail, URLs, UUIDs of each version, IP addresses, networks and interfaces, base64, paths, regexes)
and the other formats of JSON Schema's own list, each drawn so that the type behind it accepts it.

What the schema cannot say stays out of reach: a date is in the past (a ``FutureDate`` refuses it),
a date-time carries its time zone (a ``NaiveDatetime`` refuses it), a URL is https (a ``FileUrl`` or
a database DSN refuses it), a path need not exist (a ``FilePath`` refuses it). A format that is not
known here gets plain text, as a model told only "a string" would write.
"""

from __future__ import annotations

import base64
import random
import uuid
from collections.abc import Callable, Sequence

Words = Sequence[str]


def _date(rng: random.Random) -> str:
    return f"{rng.randint(2015, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _time(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.choice((0, 15, 30, 45)):02d}:00"


def _uuid(version: int) -> Callable[[random.Random, Words], str]:
    """A UUID of ``version`` (its version and RFC 4122 variant bits set, as ``uuid.UUID`` reads them)."""

    def draw(rng: random.Random, words: Words) -> str:
        bits = rng.getrandbits(128)
        bits = (bits & ~(0xF000 << 64)) | (version << 76)
        bits = (bits & ~(0xC000 << 48)) | (0x8000 << 48)
        return str(uuid.UUID(int=bits))

    return draw


def _base64(encode: Callable[[bytes], bytes]) -> Callable[[random.Random, Words], str]:
    """Words, encoded: valid base64 that also decodes to UTF-8 text (a ``Base64Str``)."""

    def draw(rng: random.Random, words: Words) -> str:
        return encode(" ".join(rng.sample(list(words), 2)).encode()).decode()

    return draw


def _host(rng: random.Random, words: Words) -> str:
    return f"www.{rng.choice(words)}.example.com"


def _email(rng: random.Random, words: Words) -> str:
    return f"{rng.choice(words)}.{rng.choice(words)}@example.com"


def _ipv4(rng: random.Random) -> str:
    return f"192.168.{rng.randint(0, 255)}.{rng.randint(1, 254)}"


def _ipv6(rng: random.Random) -> str:
    return f"2001:db8::{rng.randint(1, 0xFFFF):x}"


_FORMATS: dict[str, Callable[[random.Random, Words], str]] = {
    "date": lambda rng, _: _date(rng),
    "time": lambda rng, _: _time(rng),
    "date-time": lambda rng, _: f"{_date(rng)}T{_time(rng)}Z",
    "duration": lambda rng, _: f"P{rng.randint(0, 30)}DT{rng.randint(0, 23)}H{rng.randint(0, 59)}M",
    "email": _email,
    "idn-email": _email,
    "name-email": lambda rng, words: f"{rng.choice(words).title()} <{_email(rng, words)}>",
    "hostname": _host,
    "idn-hostname": _host,
    "uri": lambda rng, words: f"https://{_host(rng, words)}/{rng.choice(words)}",
    "iri": lambda rng, words: f"https://{_host(rng, words)}/{rng.choice(words)}",
    "uri-reference": lambda rng, words: f"/{rng.choice(words)}/{rng.choice(words)}",
    "iri-reference": lambda rng, words: f"/{rng.choice(words)}/{rng.choice(words)}",
    "uri-template": lambda rng, words: f"https://{_host(rng, words)}/{{{rng.choice(words)}}}",
    "json-pointer": lambda rng, words: f"/{rng.choice(words)}/{rng.randint(0, 9)}",
    "relative-json-pointer": lambda rng, words: f"{rng.randint(0, 3)}/{rng.choice(words)}",
    "uuid": _uuid(4),
    **{f"uuid{version}": _uuid(version) for version in range(1, 9)},
    "ipv4": lambda rng, _: _ipv4(rng),
    "ipv6": lambda rng, _: _ipv6(rng),
    "ipvanyaddress": lambda rng, _: _ipv4(rng),
    "ipv4network": lambda rng, _: f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.0/24",
    "ipvanynetwork": lambda rng, _: f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.0/24",
    "ipv6network": lambda rng, _: f"2001:db8:{rng.randint(1, 0xFFFF):x}::/48",
    "ipv4interface": lambda rng, _: f"{_ipv4(rng)}/24",
    "ipvanyinterface": lambda rng, _: f"{_ipv4(rng)}/24",
    "ipv6interface": lambda rng, _: f"{_ipv6(rng)}/64",
    # bytes: Pydantic takes any text by default, base64 under val_json_bytes="base64": both take this.
    "binary": _base64(base64.b64encode),
    "base64": _base64(base64.b64encode),
    "base64url": _base64(base64.urlsafe_b64encode),
    "regex": lambda rng, words: f"^{rng.choice(words)}s?$",
    "path": lambda rng, words: f"/data/{rng.choice(words)}/{rng.choice(words)}.txt",
    "file-path": lambda rng, words: f"/data/{rng.choice(words)}/{rng.choice(words)}.txt",
    "directory-path": lambda rng, words: f"/data/{rng.choice(words)}",
}


def formatted(name: str, rng: random.Random, words: Words) -> str | None:
    """A string of the format ``name`` (words from ``words``), or None for a format not known here."""
    draw = _FORMATS.get(name)
    return draw(rng, words) if draw is not None else None
