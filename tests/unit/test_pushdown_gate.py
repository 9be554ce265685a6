"""Which reader Spark gets (spark_api.pushdown_requested): the one that defines ``pushFilters`` only
when Spark's pushdown planner asks (PySpark 4.1-4.3 refuse every read of such a reader while
``spark.sql.python.filterPushdown.enabled`` is off), never on a PySpark without pushdown."""

from __future__ import annotations

import importlib.machinery

from pyspark_jetstream import spark_api

PLANNER = "pyspark.sql.worker.data_source_pushdown_filters"


def _called_from(module: str, spec: str | None = None) -> bool:
    """``pushdown_requested()`` as ``reader()`` sees it when ``module``'s ``_main`` calls it (two frames up);
    ``spec``: the module as its spec names it (``python -m`` runs it as ``__main__``)."""
    scope = {"__name__": module, "ask": spark_api.pushdown_requested,
             "__spec__": importlib.machinery.ModuleSpec(spec, None) if spec else None}
    exec("def reader():\n    return ask()\ndef _main():\n    return reader()\nresult = _main()", scope)
    return scope["result"]


def test_only_the_pushdown_planner_gets_the_pushdown_reader():
    assert spark_api.pushdown_requested() is False
    assert _called_from("pyspark.sql.worker.plan_data_source_read") is False
    assert _called_from(PLANNER) is spark_api.PUSHDOWN


def test_a_pyspark_without_pushdown_never_gets_it(monkeypatch):
    monkeypatch.setattr(spark_api, "PUSHDOWN", False)
    assert _called_from(PLANNER) is False


def test_a_planner_started_as_python_dash_m_gets_the_pushdown_reader():
    """Spark's simple worker (no daemon: ``spark.python.use.daemon=false``, Windows) starts the planner
    as ``python -m pyspark.sql.worker.data_source_pushdown_filters``: its module is ``__main__``."""
    assert _called_from("__main__", PLANNER) is spark_api.PUSHDOWN
    assert _called_from("__main__", "pyspark.sql.worker.plan_data_source_read") is False
    assert _called_from("__main__") is False


def test_a_pushed_filter_narrows_only_where_tasks_can_tell_their_query(monkeypatch):
    """PySpark 4.1 gives tasks no execution start (no UUIDv7 query id): no narrowing there."""
    monkeypatch.setattr(spark_api, "PUSHDOWN", True)
    for version, scoped in (((4, 1), False), ((4, 2), True), ((4, 3), True)):
        monkeypatch.setattr(spark_api, "VERSION", version)
        assert spark_api.scoped_pushdown() is scoped, version
    monkeypatch.setattr(spark_api, "PUSHDOWN", False)
    assert spark_api.scoped_pushdown() is False
