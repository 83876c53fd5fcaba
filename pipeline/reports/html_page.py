"""Self-contained HTML pages: a template with one inline script and one inline style, data as JSON.

Every page the pipeline writes (the review page here, the runs page of ``pipeline report``) is built the
same way, and this module is the one place that decides how:

* every page's ``<head>`` opens with the same lines (:data:`PAGE_HEAD`, in place of ``__PAGE_HEAD__``):
  UTF-8, the policy below, the viewport, and no referrer sent by any link;
* the data goes into ``<script type="application/json">`` as JSON escaped so that no text in it can end
  or comment out its script element (``</script>``, ``<!--``); non-finite numbers become ``null``;
* a Content-Security-Policy allows exactly the template's own script and style (by sha256 hash) and
  nothing else: no injected script, and no network request of any kind (no CDN, font, image or beacon),
  so the file can be mailed around and opened offline;
* the file is written atomically (a temporary file beside it, then a rename): the old page or the new
  one, never half of one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import secrets
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError

HEAD_MARKER = "__PAGE_HEAD__"
PAGE_HEAD = (
    '<meta charset="utf-8">\n'
    '<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
    '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
    '<meta name="referrer" content="no-referrer">'
)
# In JSON these characters occur only inside strings, where \uXXXX is the same character: escaped, the
# data cannot end or comment out its script element, and U+2028/9 stay harmless to any JS parser.
_JSON_ESCAPES = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def render_page(template: str, data: Any, data_marker: str, *, name: str) -> str:
    """``template`` (called ``name`` in errors) with its head, policy included, and ``data`` (as JSON)."""
    for marker in (HEAD_MARKER, data_marker):
        if template.count(marker) != 1:
            raise RuntimeError(f"{name}: expected {marker} once, found it {template.count(marker)} times")
    # The head goes in first: the data, inserted last, is never searched for markers.
    head = PAGE_HEAD.format(policy=content_security_policy(template, name))
    return template.replace(HEAD_MARKER, head, 1).replace(data_marker, embed_json(data), 1)


def write_page(document: str, path: Path, what: str) -> Path:
    """Write ``document`` to ``path`` atomically; return ``path``. ``what`` names the page in errors."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        temporary.write_bytes(document.encode())
        os.replace(temporary, path)  # same folder, so atomic: the old file or the new one, never half
    except OSError as exc:
        with suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot write {what} ({exc.strerror or exc})") from exc
    return path


def embed_json(value: Any) -> str:
    """``value`` as JSON that is safe inside a ``<script>`` element (and still the same JSON)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_jsonable)
    return text.translate(_JSON_ESCAPES)


def content_security_policy(template: str, name: str = "the template") -> str:
    """Allow the template's one inline script and style, by hash; everything else, network included, not."""
    script = _hash_source(inline_block(template, "script", name))
    style = _hash_source(inline_block(template, "style", name))
    return (
        f"default-src 'none'; script-src {script}; style-src {style}; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )


def inline_block(template: str, tag: str, name: str = "the template") -> str:
    """The text of the template's one bare ``<tag>`` element (the JSON script has attributes: not it)."""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", template, flags=re.DOTALL)
    if len(blocks) != 1:
        raise RuntimeError(f"{name}: expected one <{tag}> element, found {len(blocks)}")
    return str(blocks[0])


def finite(number: float | None) -> float | None:
    """``number``, or None when it is missing, NaN or infinite (JSON has no such numbers)."""
    return number if number is not None and math.isfinite(number) else None


def finite_numbers(value: Any) -> Any:
    """``value`` with every non-finite float inside it (mappings, lists, tuples) replaced by None."""
    if isinstance(value, float):
        return finite(value)
    if isinstance(value, Mapping):
        return {key: finite_numbers(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_numbers(item) for item in value]
    return value


def _hash_source(text: str) -> str:
    digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
    return f"'sha256-{digest}'"


def _jsonable(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON: a page embeds JSON values only")
