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


def test_no_released_pyspark_narrows_a_read_by_a_pushed_filter():
    """PySpark 4.1 to 4.3 share a pushed read between every scan of a view (issue #46): only a newer
    PySpark whose reader API has ``pushLimit`` (the change that keeps the pushed read on its scan) does."""

    class Released:  # 4.1 to 4.3: pushFilters, no pushLimit
        def pushFilters(self, filters):
            return filters

    class Scoped(Released):
        def pushLimit(self, limit):
            return False

    assert spark_api.scoped_pushdown() is False  # the installed PySpark
    for version in ((4, 0), (4, 1), (4, 2), (4, 3)):
        assert spark_api.scoped_pushdown(Released, version) is False, version
        assert spark_api.scoped_pushdown(Scoped, version) is False, version
    assert spark_api.scoped_pushdown(Released, (4, 4)) is False
    assert spark_api.scoped_pushdown(Scoped, (4, 4)) is True
    assert spark_api.scoped_pushdown(object, (5, 0)) is False


def test_the_plain_reader_hands_every_filter_back():
    """With the conf on, Spark's pushdown planner gets the plain reader on 4.1 to 4.3: its pushFilters
    (the base class's) returns every filter, so Spark pushes none and the read is the whole read."""
    import pytest

    if not spark_api.PUSHDOWN:
        pytest.skip("this PySpark has no filter pushdown (4.0): there is nothing to hand back")
    from pyspark.sql.datasource import EqualTo

    from pyspark_jetstream.source.spark_readers import JetStreamBatchReader

    filters = [EqualTo(("subject",), "a.b")]
    assert list(JetStreamBatchReader.pushFilters(object.__new__(JetStreamBatchReader), filters)) == filters
