"""The README's own-code script runs as it is: a session, a local server from the ``[server]`` extra,
a batch write, a batch read and a streaming copy."""

from __future__ import annotations

import sys

from ..helpers import readme_python_block, run_script


def test_the_readmes_first_job_runs_as_it_is(tmp_path):
    script = tmp_path / "first_job.py"
    script.write_text(readme_python_block("# first_job.py"))
    out = run_script(sys.executable, script, cwd=tmp_path)
    # The batch read's table shows the three orders with their TTLs (the null one took defaultTtl);
    # the write's two partitions publish side by side, so the sequences are 1..3 in either order.
    table = [line for line in out.splitlines() if line.startswith("|") and "orders.c" in line]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    assert sorted(row[0] for row in cells) == ["1", "2", "3"]
    assert sorted(row[1:4] for row in cells) == [
        ["orders.c1", '{"id": 1, "amount": 9.5}', "1h"],
        ["orders.c1", '{"id": 3, "amount": 4.25}', "never"],
        ["orders.c2", '{"id": 2, "amount": 20.0}', "30m"],
    ]
    assert all(row[4] != "NULL" for row in cells if row[3] != "never")  # expires_at for a finite TTL
    # The streaming copy carried every order to ORDERS_COPY.
    assert "ORDERS_COPY: ['copy.orders.c1', 'copy.orders.c1', 'copy.orders.c2']" in out.splitlines()
