"""The order the test files are handed to the two test processes (``--dist loadfile``).

Two rules, each for a measured reason (docs/architecture.md, "The suite within CI's 25 minutes"):

- The unit tests first. They start no JVM, so they run while the JVMs' class-data archive is built
  in the background (tests/jvm_archive.py: about 85 s of one core on a fresh machine), on the core
  the build leaves free. Before, both test processes waited for the build with a core idle.
- Then the integration files, longest first, and the short ones last, so that the two processes end
  together instead of one finishing a long file alone. The seconds below are each file's summed
  test time in three runs of the suite on 2 cores (rounded); a file not listed takes under 15 s.
  A stale figure only changes the order, never what runs.
"""

from __future__ import annotations

SECONDS = {
    "test_source": 181, "test_pushdown_answers": 162, "test_subject_order": 140, "test_cluster": 125,
    "test_sink_batch": 111, "test_task_retry": 108, "test_package": 107, "test_examples": 140,
    "test_kv_sink": 95, "test_upgrade": 92, "test_sink_batched": 78, "test_faults": 67,
    "test_kv_replayed_cas": 64, "test_replay_past_window": 63, "test_source_faults": 63,
    "test_secrets_everywhere": 61, "test_order_guard_scratch": 60, "test_stuck_server": 53,
    "test_sink_streaming": 51, "test_recreated_streams": 41, "test_kv_sequence": 39, "test_cluster_moves": 37,
    "test_current_data": 36, "test_keys": 36, "test_copy_under_load": 35, "test_sink_ids": 33,
    "test_threads": 33, "test_replay_ids": 30, "test_worker_zone": 29, "test_pushdown_subjects": 26,
    "test_columns": 25, "test_fast_ingest": 20, "test_kv_source": 19, "test_sink_auth": 18,
    "test_authorization": 15, "test_lookup": 70, "test_lookup_cluster": 30, "test_kv_topologies_remote": 30,
    "test_outage_logs": 15, "test_write_check": 25,
}


def file_order(path: str) -> tuple[int, int, str]:
    """The sort key of a test file (its path relative to the repository's root, with '/')."""
    unit = path.startswith("tests/unit/")
    return (0 if unit else 1, -SECONDS.get(path.rsplit("/", 1)[-1].removesuffix(".py"), 0), path)
