"""Moved to :mod:`mtpcheck.machinery.scheduling` (docs/architecture.md); this path
stays importable for downstream code. The old name is the same module object
(sys.modules alias), so attributes, private names and monkeypatching behave
as before."""

import sys

from mtpcheck.machinery import scheduling

sys.modules[__name__] = scheduling
