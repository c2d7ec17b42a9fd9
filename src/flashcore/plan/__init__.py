"""Which kernel runs, and how: the planning layer.

* ``select.py``: :func:`~flashcore.plan.select.select`, the one selection function (choice + reasons);
* ``tables.py``: the per-architecture configuration tables (measured; docs/perf-notes.md);
* ``knobs.py``: every switch (environment variables, Gluon kernel switches), all part of every plan key;
* ``build.py``: a :class:`~flashcore.plan.build.Plan` = ordered steps + the workspace they need;
* ``cache.py``: the one plan cache.

(This package's ``__init__`` imports nothing: ``flashcore.launch`` reads ``tables`` and ``knobs`` while
``build`` reads ``flashcore.launch``.)"""
