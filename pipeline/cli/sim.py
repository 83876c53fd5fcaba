"""``pipeline sim``: the vLLM-like simulator, served until Ctrl-C."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pipeline.cli.common import app, fail, seed_option
from pipeline.errors import ConfigError

if TYPE_CHECKING:  # the simulator loads only for `sim`
    from pipeline.sim import SimConfig

PortOption = Annotated[int, typer.Option(help="0 picks a free port.")]
HostOption = Annotated[str, typer.Option(help="The address to listen on.")]
SimModelOption = Annotated[
    str | None,
    typer.Option(
        help="The model name it serves. Default: the profile's (gpt-oss-120b: openai/gpt-oss-120b, "
        "what the jobs ask for); sim-model without a profile."
    ),
]
ProfileOption = Annotated[
    str | None,
    typer.Option(help="Calibrated engine: gpt-oss-120b, nemotron-super-49b, nemotron-nano-9b."),
]
SpeedOption = Annotated[
    float, typer.Option(min=0.001, help="Time compression of the engine (50: 50x faster).")
]
MaxNumSeqsOption = Annotated[int | None, typer.Option(min=1, help="Override the profile's --max-num-seqs.")]
KvCacheTokensOption = Annotated[
    int | None,
    typer.Option(
        "--kv-tokens",
        "--kv-cache-tokens",
        min=1,
        help="The KV cache in tokens, overriding the profile's: requests are admitted and preempted by "
        "the blocks of 16 tokens they hold, those of a prefix they share held once (/metrics: "
        "num_gpu_blocks = N / 16).",
    ),
]
KvThrashOption = Annotated[
    float | None,
    typer.Option(
        min=0,
        help="How steeply throughput falls past the KV cache: decoding at (cache / demanded) ** X of its "
        "speed (default 1.35 with --kv-tokens, a dense 49B's fall past c=256; else 0: it only flattens).",
    ),
]
PrefixCachingOption = Annotated[
    bool,
    typer.Option(
        help="Reuse a prompt prefix seen before and hold it once, as vLLM does by default "
        "(--no-prefix-caching: every prompt token prefilled and held by each request, no hits, "
        'enable_prefix_caching="False" in /metrics).'
    ),
]
AnswerInReasoningOption = Annotated[
    bool,
    typer.Option(
        help="gpt-oss's parser bug (vLLM issue 23694): with response_format, the JSON comes in "
        'message.reasoning and content is null, finish_reason "stop".'
    ),
]
LatencyOption = Annotated[float, typer.Option(help="Without a profile: seconds per request.")]
SecondsPerTokenOption = Annotated[float, typer.Option(help="Without a profile: seconds per token.")]
JitterOption = Annotated[float, typer.Option(min=0, max=1, help="± fraction of the fixed delay.")]
SimSeedOption = Annotated[
    int, seed_option("the answers, the faults and the noise: the same seed, the same run")
]
MaxModelLenOption = Annotated[
    int, typer.Option(min=1, help="The context: prompt and answer tokens a request may take (a 400 past it).")
]
ApiKeyOption = Annotated[str | None, typer.Option(help="Require this bearer key.")]
ReasoningFieldOption = Annotated[str, typer.Option(help="reasoning (vLLM ≥ 0.10) or reasoning_content.")]
ListContextOption = Annotated[
    bool,
    typer.Option(
        help="List max_model_len in /v1/models, as vLLM does (--no-list-context: as servers that do not)."
    ),
]
TokenizeOption = Annotated[
    bool, typer.Option(help="Count a prompt's tokens at POST /tokenize, as vLLM does (--no-tokenize: a 404).")
]


def _fault(what: str) -> Any:
    """A ``--fault-*`` option: the share of chat requests (0 to 1) answered with ``what``."""
    return typer.Option(min=0, max=1, help=f"Share of chat requests (0-1) that get {what}.")


ServerErrorFault = Annotated[float, _fault("a 500 (or a 503 with Retry-After)")]
ResetFault = Annotated[float, _fault("their connection dropped without an answer")]
HangFault = Annotated[float, _fault("no answer at all: only the client's timeout ends them")]
InvalidJsonFault = Annotated[float, _fault("an answer that is not valid JSON")]
SchemaInvalidFault = Annotated[float, _fault("valid JSON that breaks the requested schema")]
LengthFault = Annotated[float, _fault('an answer cut short, finish_reason "length"')]
ContextLengthFault = Annotated[
    float, _fault("vLLM's 400 for a request past the context, as if a proxy set max_tokens to all of it")
]
RejectFormatOption = Annotated[
    bool, typer.Option(help="Answer a request with response_format with HTTP 400, as a server without it.")
]
AnswerNoiseOption = Annotated[
    float,
    typer.Option(
        min=0, max=1, help="Chance that a field of an answer is drawn afresh (temperature-0 non-determinism)."
    ),
]
PromptSensitiveOption = Annotated[
    list[str] | None,
    typer.Option(
        "--prompt-sensitive", help="A field whose answer depends on the system prompt too (repeatable)."
    ),
]
EmptyFieldOption = Annotated[
    list[str] | None,
    typer.Option("--empty-field", help='A field always answered empty: null, [] or "" (repeatable).'),
]
QuotedAnswersOption = Annotated[
    bool,
    typer.Option(
        help="Text values are phrases copied from the record (found in its text), not made-up words."
    ),
]
_FAULT = "fault_"
_ADDRESS = ("host", "port")
_LISTS = ("prompt_sensitive", "empty_fields")


@app.command()
def sim(
    ctx: typer.Context,
    port: PortOption = 8000,
    host: HostOption = "127.0.0.1",
    model: SimModelOption = None,
    profile: ProfileOption = None,
    speed: SpeedOption = 1.0,
    max_num_seqs: MaxNumSeqsOption = None,
    kv_cache_tokens: KvCacheTokensOption = None,
    kv_thrash: KvThrashOption = None,
    prefix_caching: PrefixCachingOption = True,
    latency: LatencyOption = 0.0,
    seconds_per_token: SecondsPerTokenOption = 0.0,
    jitter: JitterOption = 0.0,
    seed: SimSeedOption = 0,
    max_model_len: MaxModelLenOption = 131072,
    list_context: ListContextOption = True,
    tokenize: TokenizeOption = True,
    api_key: ApiKeyOption = None,
    reasoning_field: ReasoningFieldOption = "reasoning",
    fault_server_error: ServerErrorFault = 0.0,
    fault_reset: ResetFault = 0.0,
    fault_hang: HangFault = 0.0,
    fault_invalid_json: InvalidJsonFault = 0.0,
    fault_schema_invalid: SchemaInvalidFault = 0.0,
    fault_length: LengthFault = 0.0,
    fault_context_length: ContextLengthFault = 0.0,
    reject_response_format: RejectFormatOption = False,
    answer_in_reasoning: AnswerInReasoningOption = False,
    answer_noise: AnswerNoiseOption = 0.0,
    prompt_sensitive: PromptSensitiveOption = None,
    empty_fields: EmptyFieldOption = None,
    quoted_answers: QuotedAnswersOption = False,
) -> None:
    """Serve a vLLM-like OpenAI-compatible simulator (for tests, benchmarks and dry runs).

    Each --fault-* is a share of chat requests; at most one fault applies to a request, drawn from --seed.
    """
    import asyncio

    from pipeline.sim import ListenError, run_sim

    config = sim_config(ctx.params)

    def ready(url: str) -> None:
        typer.echo(f"serving {config.model} at {url}")
        sys.stdout.flush()

    try:
        asyncio.run(run_sim(config, host, port, on_ready=ready))
    except ListenError as refused:
        raise fail(cannot_listen(host, port, refused.error)) from None


def cannot_listen(host: str, port: int, error: OSError) -> ConfigError:
    """Why ``--host``/``--port`` cannot be listened on, as the option to change: a port already in use
    (a simulator started twice), one only root may take, a host that is not this machine's."""
    # asyncio words a refused bind at length around the C library's reason: that reason is enough.
    reason = os.strerror(error.errno) if error.errno and error.errno > 0 else error.strerror or str(error)
    if not error.errno and str(error).startswith("could not bind on any address"):
        # Python 3.13's asyncio skips each address this machine does not have (EADDRNOTAVAIL) and then
        # says only that none was left: that skipped reason is the one.
        reason = os.strerror(errno.EADDRNOTAVAIL)
    if error.errno == errno.EADDRINUSE:
        return ConfigError(
            f"--port {port}: {host}:{port} is already in use (a `pipeline sim` started before?); "
            "stop what listens there, or pick another port (--port 0: any free one)"
        )
    if error.errno == errno.EACCES:
        return ConfigError(
            f"--port {port}: cannot listen on {host}:{port} ({reason}); a port below 1024 needs root"
        )
    return ConfigError(f"--host {host}: cannot listen on {host}:{port} ({reason})")


def sim_config(options: Mapping[str, Any]) -> SimConfig:
    """The simulator's settings from ``sim``'s options, by name: each option but the address is a
    field of :class:`SimConfig` (``latency``: ``latency_s``), each ``--fault-*`` a field of its
    :class:`Faults`; so an option without a field (or the reverse) fails here, not silently."""
    from pipeline.sim import Faults, SimConfig
    from pipeline.sim.profiles import PROFILES

    profile = options.get("profile")
    if profile is not None and profile not in PROFILES:
        raise fail(ConfigError(f"--profile {profile!r}: one of {', '.join(PROFILES)}"))
    faults = {name.removeprefix(_FAULT): value for name, value in options.items() if name.startswith(_FAULT)}
    settings: dict[str, Any] = {
        ("latency_s" if name == "latency" else name): tuple(value or ()) if name in _LISTS else value
        for name, value in options.items()
        if not name.startswith(_FAULT) and name not in _ADDRESS
    }
    # The name the imitated server serves, so `sim --profile` + a job written for that server just run.
    settings["model"] = settings.get("model") or (PROFILES[profile].served_model if profile else None)
    if settings["model"] is None:
        del settings["model"]  # the simulator's own default
    return SimConfig(**settings, faults=Faults(**faults))
