"""spark-conf/ works as documented: spark-submit --properties-file ... runs the quickstart."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyspark

ROOT = Path(__file__).resolve().parents[2]
JVM_INFO = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO (?!Python)\w+: ")


def test_quickstart_through_spark_submit_with_the_properties_file(tmp_path):
    spark_submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent)) or str(
        Path(pyspark.__file__).parent / "bin" / "spark-submit")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_CONF_DIR": str(ROOT / "spark-conf")}
    done = subprocess.run(
        [spark_submit, "--master", "local[2]", "--properties-file", str(ROOT / "spark-conf" / "spark-defaults.conf"),
         str(ROOT / "examples" / "quickstart.py"), "--orders", "500"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Stream ORDERS: 500 messages" in done.stdout
    assert "JetStream sink write committed: 500 published" in done.stderr
    # spark-conf/log4j2.properties prints "%d %p %c{1}: %m": Spark's own INFO lines (SparkContext's
    # "Running Spark version ..." first of all) would read "... INFO SparkContext: ...".
    jvm_info = [line for line in done.stderr.splitlines() if JVM_INFO.match(line)]
    assert jvm_info == [], jvm_info[:5]
