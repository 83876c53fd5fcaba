"""The alternative clients benchmarks/compare_clients.py races against `pipeline run`.

Each module is a script run as its own child process (``python -m clients.NAME`` with ``benchmarks/`` on
``PYTHONPATH``), so the kernel accounts its CPU time and peak memory separately. Only
:mod:`clients.prepare` imports ``pipeline``; the others read the files it writes, and
:mod:`clients.common` uses the standard library only, so the Curator client can import it from a
virtualenv without this project installed.
"""
