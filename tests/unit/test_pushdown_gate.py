"""Which reader Spark gets (spark_api.pushdown_requested): the one that defines ``pushFilters`` only
when Spark's pushdown planner asks (PySpark 4.1-4.3 refuse every read of such a reader while
``spark.sql.python.filterPushdown.enabled`` is off), never on a PySpark without pushdown."""

from __future__ import annotations

from pyspark_jetstream import spark_api

PLANNER = "pyspark.sql.worker.data_source_pushdown_filters"


def _called_from(module: str) -> bool:
    """``pushdown_requested()`` as ``reader()`` sees it when ``module``'s ``_main`` calls it (two frames up)."""
    scope = {"__name__": module, "ask": spark_api.pushdown_requested}
    exec("def reader():\n    return ask()\ndef _main():\n    return reader()\nresult = _main()", scope)
    return scope["result"]


def test_only_the_pushdown_planner_gets_the_pushdown_reader():
    assert spark_api.pushdown_requested() is False
    assert _called_from("pyspark.sql.worker.plan_data_source_read") is False
    assert _called_from(PLANNER) is spark_api.PUSHDOWN


def test_a_pyspark_without_pushdown_never_gets_it(monkeypatch):
    monkeypatch.setattr(spark_api, "PUSHDOWN", False)
    assert _called_from(PLANNER) is False
