"""Facts the documentation states about the code, checked against the code."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

from doc_blocks import REPO
from rollbox import Capabilities


def test_the_capability_table_lists_every_flag() -> None:
    text = (REPO / "docs" / "writing-a-backend.md").read_text()
    table = text[text.index("| flag | means |"):]
    table = table[:table.index("\n\n")]
    documented = {flag for row in table.splitlines()[2:]
                  for flag in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    declared = {field.name for field in dataclasses.fields(Capabilities)}
    assert documented == declared, (f"missing from the table: {declared - documented}; "
                                    f"not flags: {documented - declared}")


def test_the_bench_table_in_the_docs_has_the_rows_the_bench_prints(tmp_path: Path) -> None:
    text = (REPO / "docs" / "bench.md").read_text()
    sample = text[text.index("```text\nworkload:") + 8:]
    sample = sample[:sample.index("```")]
    result = subprocess.run(
        [str(Path(sys.executable).with_name("rollbox")), "bench", "--backend", "fake",
         "--think-ms", "0", "--images", "4", "--rollouts", "2", "--quiet"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "ROLLBOX_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr

    def labels(table: str) -> list[str]:
        return [line[:22].strip() for line in table.splitlines()[1:]]

    assert labels(sample) == labels(result.stdout)
