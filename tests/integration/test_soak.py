"""The soak, short: one round of the 3-broker scenario with mixed faults, default settings.

``crawlfleet chaos --soak`` runs such rounds for hours; CI runs one, judged by the
independent checker (the site's request log, the store's rows read through SQL, the
reachable set computed from the site generator): nothing lost, nothing duplicated, the
pipeline drained as the broker sees it, over-apply within its bound. The round writes
its line to a results file of its own (never the committed one) and keeps its folder
only if it failed (the evidence: report, lineage of lost URLs, logs).

Its faults are worker kills, every broker restarted at once (the fault after which a fetch
and a parse worker stood in commit retries for five minutes, until their consumers left the
group for not polling) and a store restart under readers. The other kinds run in the soak
proper; a round of all of them takes longer than CI's share for this test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from chaos.fault_plan import RESTART_ALL, STORE_RESTART, WORKER_KILL
from chaos.report import print_report
from chaos.soak import SoakConfig, read_results, run_soak

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_a_short_soak_round_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    console = Console(stderr=True, width=120, force_terminal=False)
    cfg = SoakConfig(minutes=0.01, max_rounds=1, pages=600, kinds=(RESTART_ALL, STORE_RESTART),
                     heavy_per_round=2, results=tmp_path / "soak.jsonl",
                     data_dir=tmp_path / "soak", round_timeout_s=200.0)
    result = run_soak(cfg, console)
    if result.failed is not None:
        print_report(result.failed, console)
    (line,) = read_results(cfg.results)
    assert line == result.rounds[0]
    assert line["drained"], line["failures"]
    assert line["lost"] == 0, f"lost {line['lost']}; evidence in {line['evidence']}"
    assert line["duplicates"] == 0, line
    assert line["pages"] == line["stored"] == 600
    assert line["within_bound"], (line["over_apply"], line["over_apply_bound"])
    assert line["faults"].get(RESTART_ALL) == 1 and line["faults"].get(STORE_RESTART) == 1, line
    assert line["faults"].get(WORKER_KILL, 0) >= 2, line
    assert not line["fault_errors"], line["fault_errors"]
    assert line["ok"] and result.ok
    # A passing round leaves no folder behind.
    assert not any((tmp_path / "soak" / "runs").glob("*"))
