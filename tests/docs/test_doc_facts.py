"""Facts the documentation states about the code, checked against the code."""

from __future__ import annotations

import dataclasses
import re

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
