"""Server profiles the simulator reproduces: published aggregate output tok/s at fixed concurrency
(~1,500-token prompts, ≤ 400 output tokens), plus the deployment settings that shape the curve."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# The reference request shape of the published measurements.
REFERENCE_PROMPT_TOKENS = 1500
REFERENCE_OUTPUT_TOKENS = 400


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    # (concurrency, aggregate output tok/s) as measured, prefill included.
    measured: tuple[tuple[int, float], ...]
    max_num_seqs: int
    kv_cache_tokens: int
    prefill_tokens_per_s: float
    reasoning_tokens: dict[str, int] = field(default_factory=dict)
    # The name vLLM serves the model under (its Hugging Face id), so a job written for the real server
    # runs against the simulator unchanged; None: the simulator's own default name.
    served_model: str | None = None

    def measured_at(self, concurrency: float) -> float:
        """The measured curve, linearly interpolated; flat beyond its ends."""
        points = self.measured
        if concurrency <= points[0][0]:
            return points[0][1] * concurrency / points[0][0]
        if concurrency >= points[-1][0]:
            return points[-1][1]
        index = bisect.bisect_left([c for c, _ in points], concurrency)
        (c0, t0), (c1, t1) = points[index - 1], points[index]
        return t0 + (t1 - t0) * (concurrency - c0) / (c1 - c0)

    def decode_tokens_per_s(self, batch: float) -> float:
        """Aggregate decode speed with ``batch`` sequences running, prefill excluded.

        The measured curve includes the prefill of the reference prompts. At steady state with c
        sequences, M(c)/O requests finish (and start) per second, each needing P/R seconds of prefill,
        so decode runs a fraction 1 - M·P/(O·R) of the time: D = M / (1 - M·P/(O·R)).
        """
        measured = self.measured_at(batch)
        reference_prefill_s = REFERENCE_PROMPT_TOKENS / self.prefill_tokens_per_s
        prefill_share = measured * reference_prefill_s / REFERENCE_OUTPUT_TOKENS
        return measured / max(0.05, 1.0 - prefill_share)


_GPT_OSS_REASONING = {"minimal": 16, "low": 96, "medium": 384, "high": 1536}

PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(
            name="gpt-oss-120b",  # MoE on a DGX Spark: weak at one stream, strong at many
            measured=(
                (1, 33.5),
                (2, 59.5),
                (4, 87.6),
                (8, 123.0),
                (16, 173.0),
                (32, 252.0),
                (64, 373.0),
                (96, 481.0),
                (128, 565.0),
                (192, 705.0),
                (256, 863.0),
                (384, 771.0),
            ),
            max_num_seqs=512,
            kv_cache_tokens=4_800_000,  # ~9% used at c=256 with the reference shape
            prefill_tokens_per_s=40_000.0,
            reasoning_tokens=_GPT_OSS_REASONING,
            served_model="openai/gpt-oss-120b",
        ),
        Profile(
            name="nemotron-super-49b",  # dense: slow at one stream, collapses past the KV cache
            measured=((1, 5.8), (8, 45.0), (32, 162.0), (128, 491.0), (256, 695.0), (320, 515.0)),
            max_num_seqs=512,
            kv_cache_tokens=620_000,  # full at c=320
            prefill_tokens_per_s=12_000.0,
            served_model="nvidia/Llama-3_3-Nemotron-Super-49B-v1_5",
        ),
        Profile(
            name="nemotron-nano-9b",  # hybrid: scales to 8 sequences, then queues
            measured=((1, 26.0), (2, 51.0), (8, 153.0)),
            max_num_seqs=8,
            kv_cache_tokens=400_000,
            prefill_tokens_per_s=30_000.0,
            served_model="nvidia/NVIDIA-Nemotron-Nano-9B-v2",
        ),
    )
}
