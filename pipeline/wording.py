"""How a number is said to a person, in every command's output: a count with its thousands separated
(:func:`number`: ``2,499``), a count with its noun in the form it takes (:func:`counted`: ``1 record``,
``2 records``), and a time said as the model's or the wall's (:func:`model_time`). Machine output
(``--json``, CSV, the JSON log) keeps plain numbers.

Beneath every package that prints (the job's errors, quality's measures, reports, the run, bench, the
CLI), light and pure, so each of them says a number the same way.

May import: the standard library only.
"""

from __future__ import annotations


def number(count: float) -> str:
    """A count as a person reads it: ``2,499``; ``2.5`` for a count that is not whole (several people
    splitting a value)."""
    return f"{int(count):,}" if float(count).is_integer() else f"{count:,.1f}"


def counted(count: float, noun: str, plural: str | None = None) -> str:
    """``count`` with ``noun`` in the form it takes: ``1 record``, ``0 records``, ``1,234 values``,
    ``2.5 values``; ``plural`` for a noun that does not take an s (``counted(2, "person", "people")``).
    Every count a report or a command prints with its noun goes through it."""
    one = float(count).is_integer() and abs(int(count)) == 1
    return f"{number(count)} {noun if one else plural or noun + 's'}"


def duration(seconds: float) -> str:
    """``42 s``, ``4.2 min``, ``32 h``: as a person reads a wait."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.0f} h" if seconds >= 36000 else f"{seconds / 3600:.1f} h"


def model_time(model_s: float, speed: float, where: str = "") -> str:
    """A time measured against a server, named as what it is. Against a simulator at ``--speed``
    (its seconds are ``speed`` of the model's) the model's time, with the wall time it takes here
    beside it: ``~17.0 min of model time here (20 s wall time at --speed 50)``; against a real server
    (speed 1) the two are one: ``~17.0 min here``. ``where`` (`` here``) follows the time."""
    said = f"~{duration(model_s)}"
    if speed == 1:
        return said + where
    return f"{said} of model time{where} ({duration(model_s / speed)} wall time at --speed {speed:g})"
