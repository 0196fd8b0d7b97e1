"""The syrupy extension of the golden snapshots (kept apart from
:mod:`mtpcheck.machinery.golden` so that importing that module, as `mtpcheck`'s
command line does, does not import syrupy before pytest registers it). The
document functions come from golden through ``golden_extension`` (class
attributes), so this module imports nothing of golden's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from syrupy.extensions.amber import AmberSnapshotExtension


class GoldenExtension(AmberSnapshotExtension):
    """syrupy extension: amber files under ``<root>/<backend>/``, JSON entries,
    tolerant comparison, token-level diff. Use :func:`golden_extension` to get
    the class for one backend and one root."""

    root: Path = Path("golden")
    backend: str = "default"
    # golden's serialize, _parse, compare, token_diff (set by golden_extension)
    serialize_doc: Any = None
    parse_doc: Any = None
    compare_docs: Any = None
    diff_docs: Any = None

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(Path(cls.root) / cls.backend)

    @classmethod
    def discovery_dirname(cls, *, test_location) -> str:
        # the whole golden root: a folder of a backend no test names any more
        # is found, and its entries fail the run as unused
        return str(Path(cls.root))

    def serialize(self, data: Any, *, exclude=None, include=None, matcher=None) -> str:
        return self.serialize_doc(data, exclude=exclude, include=include, matcher=matcher)

    def matches(self, *, serialized_data: Any, snapshot_data: Any) -> bool:
        now, golden = self.parse_doc(serialized_data), self.parse_doc(snapshot_data)
        if now is None or golden is None:
            return serialized_data == snapshot_data
        return not self.compare_docs(now, golden)

    def diff_lines(self, serialized_data: Any, snapshot_data: Any):
        yield from self.diff_docs(serialized_data, snapshot_data)
        yield f"  golden file: {Path(self.root) / self.backend}; accept the change with " \
              f"`mtpcheck golden update --backend {self.backend}`"
