"""A store process writes rows without importing pandas: clickhouse-connect would import it
on the first insert only to ask whether the rows are a DataFrame (0.17 CPU-s at every
store's start, ~40 MB of its memory)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_store_inserts_and_reads_rows_without_importing_pandas(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import sys
        from core.config import load_settings
        from infra.clickhouse import Store
        store = Store(load_settings(data_dir=sys.argv[1]), owner=True)
        store.ensure_schema()
        store.warm_up()  # an insert, through the same insert path as every batch
        store.insert("quarantines", ["scope", "key"], [], "empty")  # nothing: no-op
        store.command("CREATE TABLE t (a String, n UInt32) ENGINE = MergeTree ORDER BY a")
        store.insert("t", ["a", "n"], [("x", 1), ("y", 2)], "t|1")
        print(store.query("SELECT sum(n) FROM t")[1][0][0], "pandas" in sys.modules)
        store.close()
    """)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "data")],
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "False"], out.stdout
