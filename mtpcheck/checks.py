"""Moved to :mod:`mtpcheck.machinery.checks` (docs/architecture.md); this path
stays importable for downstream code. The old name is the same module object
(sys.modules alias), so attributes, private names and monkeypatching behave
as before."""

import sys

from mtpcheck.machinery import checks

sys.modules[__name__] = checks
