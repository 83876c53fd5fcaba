"""Where a job's requests go: ``endpoint:`` (one server, and the defaults for all) and ``endpoints:`` (a
list of servers, each at its own concurrency, fixed or ``auto``), resolved into :class:`EndpointConfig`.

:func:`checked_base_url` is the one check of a server's URL, wherever one is accepted: the job file's
keys (their ``${VAR}`` values included) through the models here, and command-line options through
:func:`checked_url_option`.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from pipeline.errors import ConfigError

#: ``endpoint.base_url: local`` runs the job against the embedded local vLLM server.
LOCAL_ENDPOINT = "local"
#: The model name that server serves (:mod:`pipeline.local`), so a local run's results carry it.
LOCAL_MODEL = "smollm2-135m"
#: ``concurrency: auto``: an adaptive limit per endpoint (:mod:`pipeline.servers.limits`), up to
#: max_concurrency.
AUTO = "auto"
CONCURRENCY_RULE = "must be a number from 1 to 8192, or auto"


def _concurrency(value: object) -> int | str:
    """A number of requests in flight, or ``auto``, in one message when it is neither."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(CONCURRENCY_RULE)
    try:
        number = int(value)
    except ValueError:
        raise ValueError(CONCURRENCY_RULE) from None
    if not 1 <= number <= 8192:
        raise ValueError(CONCURRENCY_RULE)
    return number


Concurrency = Annotated[int | Literal["auto"], BeforeValidator(_concurrency)]
CONTEXT_RULE = "must be a whole number of tokens from 1 to 100000000 (the server's --max-model-len)"


def _context_tokens(value: object) -> int:
    """A context length in tokens (``max_model_len``), in one message when it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(CONTEXT_RULE)
    try:
        number = int(value)
    except ValueError:
        raise ValueError(CONTEXT_RULE) from None
    if not 1 <= number <= 100_000_000:
        raise ValueError(CONTEXT_RULE)
    return number


#: ``max_model_len``: prompt and answer tokens one request may take on a server (vLLM's
#: ``--max-model-len``); given in the job, it overrides what the server's ``/v1/models`` lists.
ContextLength = Annotated[int, BeforeValidator(_context_tokens)]
_KEY_ENV_PATTERN = r"^[A-Z_][A-Z0-9_]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def checked_base_url(value: str, *, local_allowed: bool) -> str:
    if local_allowed and value == LOCAL_ENDPOINT:
        return value
    if not value.startswith(("http://", "https://")):
        extra = f" (or be '{LOCAL_ENDPOINT}')" if local_allowed else ""
        raise ValueError(f"must start with http:// or https://{extra}")
    parts = urllib.parse.urlsplit(value)
    # The URL is stored in the runs table and printed in errors, so it must not carry a secret;
    # the value is not echoed for the same reason.
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ValueError(
            "must not contain credentials, a query or a fragment: put the API key in an environment "
            "variable named by endpoint.api_key_env"
        )
    if not parts.hostname:
        raise ValueError("has no host name")
    port = _port_text(parts.netloc)
    if port is not None and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"port {port!r} is not a number from 1 to 65535 ({value})")
    return value.rstrip("/")


def _port_text(netloc: str) -> str | None:
    """The port as written after the host (``None`` without one; an empty one means the default)."""
    after_host = netloc.rpartition("]")[2] if netloc.startswith("[") else netloc
    _, colon, port = after_host.partition(":")
    return port if colon and port else None


def checked_url_option(option: str, value: str, *, local_allowed: bool = False) -> str:
    """A URL given on the command line (``--endpoint``), checked as the job file's are: a bad one is a
    :class:`ConfigError` naming the option."""
    try:
        return checked_base_url(value, local_allowed=local_allowed)
    except ValueError as error:
        raise ConfigError(f"{option}: {error}") from None


def api_path_hint(base_url: str) -> str:
    """What to say when a server answers 404 at ``base_url`` (its ``/models``, its chat completions):
    vLLM (and OpenAI) serve the API under ``/v1``, which a URL like ``http://host:8000`` leaves out.
    Empty when the URL ends in ``/v1``."""
    url = base_url.rstrip("/")
    if urllib.parse.urlsplit(url).path.endswith("/v1"):
        return ""
    return f"vLLM serves its API under /v1: did you mean {url}/v1?"


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
LISTEN_HOST_RULE = (
    "must be an IP address or a host name of this machine (127.0.0.1, ::1, 0.0.0.0, ::), "
    "without a scheme or a port"
)


def checked_listen_host(value: str) -> str:
    """A host one of our own servers listens on (``operations.metrics_host``): an IP address (IPv6
    with or without brackets) or a host name. Whether this machine has it shows only when binding."""
    bare = value.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    labels = bare.removesuffix(".").split(".")
    # All digits and dots, yet no IP address (999.1.1.1): a typo, not a name.
    numeric = all(label.isdigit() for label in labels)
    if len(bare) > 253 or numeric or not all(_HOST_LABEL.match(label) for label in labels):
        raise ValueError(f"{value!r} {LISTEN_HOST_RULE}")
    return bare


def checked_host_option(option: str, value: str) -> str:
    """A listen host given on the command line, checked as the job key is: a :class:`ConfigError`
    naming the option."""
    try:
        return checked_listen_host(value)
    except ValueError as error:
        raise ConfigError(f"{option}: {error}") from None


class EndpointSpec(_Strict):
    """``endpoint:``: the server of a one-server job, and the defaults of every ``endpoints:`` entry."""

    base_url: str | None = Field(default=None, min_length=1)
    # The NAME of the variable holding the key: a key pasted here would end up in messages.
    api_key_env: str | None = Field(default=None, pattern=_KEY_ENV_PATTERN, max_length=128)
    structured_output: bool = True
    max_model_len: ContextLength | None = None

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return None if value is None else checked_base_url(value, local_allowed=True)

    @property
    def is_local(self) -> bool:
        return self.base_url == LOCAL_ENDPOINT


class EndpointEntry(_Strict):
    """One server of ``endpoints:``; what it leaves out comes from ``endpoint:`` and the job."""

    base_url: str = Field(min_length=1)
    concurrency: Concurrency | None = None
    max_concurrency: int | None = Field(default=None, ge=1, le=8192)
    model: str | None = Field(default=None, min_length=1)
    api_key_env: str | None = Field(default=None, pattern=_KEY_ENV_PATTERN, max_length=128)
    structured_output: bool | None = None
    max_model_len: ContextLength | None = None

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return checked_base_url(value, local_allowed=False)


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """One server as a run uses it."""

    base_url: str
    model: str
    concurrency: int | None  # None: auto
    max_concurrency: int
    api_key_env: str | None
    structured_output: bool
    max_model_len: int | None = None  # the job's override of the server's context length

    @property
    def name(self) -> str:
        """A short label for logs and metrics: host:port."""
        parts = urllib.parse.urlsplit(self.base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.hostname}:{port}"

    @property
    def most_in_flight(self) -> int:
        return self.concurrency if self.concurrency is not None else self.max_concurrency

    @property
    def knee_key(self) -> str:
        """What a knee found by `concurrency: auto` belongs to: this server serving this model."""
        return f"{self.base_url} {self.model}"


def resolve_endpoints(
    endpoint: EndpointSpec,
    entries: list[EndpointEntry],
    *,
    model: str,
    concurrency: Concurrency,
    max_concurrency: int,
    max_model_len: int | None = None,
) -> list[EndpointConfig]:
    """``endpoints:`` with the defaults filled in, or ``endpoint:`` as the only one. ``max_model_len``
    comes from the entry, else ``endpoint:``, else the job (``max_model_len``)."""
    if not entries:
        assert endpoint.base_url is not None  # the job spec checks it
        entries = [EndpointEntry.model_construct(base_url=endpoint.base_url)]
    resolved = []
    for entry in entries:
        level = entry.concurrency if entry.concurrency is not None else concurrency
        resolved.append(
            EndpointConfig(
                base_url=entry.base_url,
                model=entry.model or model,
                concurrency=None if level == AUTO else int(level),
                max_concurrency=entry.max_concurrency or max_concurrency,
                api_key_env=entry.api_key_env or endpoint.api_key_env,
                structured_output=(
                    endpoint.structured_output if entry.structured_output is None else entry.structured_output
                ),
                max_model_len=entry.max_model_len or endpoint.max_model_len or max_model_len,
            )
        )
    return resolved
