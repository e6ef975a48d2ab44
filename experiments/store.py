"""The committed record of one experiment's cells: ``OUT/cells.jsonl`` (``experiments/cells.py``).

One JSON line per finished cell, sorted by cell id (``<dataset>/<row key>/seed<k>-<config hash>``,
the cell's folder under the cell cache)::

    {"cell": "<id>", "record": {<the cell's metrics.json>}, "protocols": {<key>: <Fig. 6 result>}}

(``protocols`` only once a Fig. 6 result was computed). A record holds the cell's mean and
per-scene metrics, plane errors, training facts and the provenance of the code that trained it:
everything a report is built from, so an experiment's report regenerates from this file alone
(``--report-only``). The per-cell cache (checkpoints, configs, logs) is git-ignored; it is only
needed to train, and the benchmark's own command rebuilds it.
"""

from __future__ import annotations

import json
from pathlib import Path
from hrope.nvs.running.atomic import write_text

__all__ = ["CellStore", "CELLS_NAME"]

CELLS_NAME = "cells.jsonl"


class CellStore:
    """The cells of ``path`` (read when it exists), changed in memory and written by :meth:`save`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._cells: dict[str, dict] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    entry = json.loads(line)
                    self._cells[entry.pop("cell")] = entry
        self._changed = False

    def ids(self) -> list[str]:
        return sorted(self._cells)

    def record(self, cell: str) -> dict | None:
        """The finished cell's record, or None."""
        entry = self._cells.get(cell)
        return None if entry is None else entry["record"]

    def protocols(self, cell: str) -> dict:
        """The cell's Fig. 6 results by protocol key (empty when none)."""
        return dict(self._cells.get(cell, {}).get("protocols", {}))

    def put(self, cell: str, record: dict, protocols: dict | None = None) -> None:
        """Set the cell's record (and its Fig. 6 results, unless None: then the stored ones stay)."""
        entry = {"record": record}
        protocols = self.protocols(cell) if protocols is None else protocols
        if protocols:
            entry["protocols"] = protocols
        if self._cells.get(cell) != entry:
            self._cells[cell] = entry
            self._changed = True

    def save(self) -> None:
        """Write the file (atomically) when a cell changed since it was read or last written."""
        if not self._changed:
            return
        write_text(self.path, "".join(json.dumps({"cell": cell, **self._cells[cell]}) + "\n" for cell in self.ids()))
        self._changed = False
