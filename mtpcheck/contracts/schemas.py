"""JSON Schema export of the contracts to `contracts/schemas/`."""

from __future__ import annotations

import json
from pathlib import Path

from .models import SCHEMA_MODELS
from .report import REPORT_MODELS  # the run's JSON report is an interface too


def render_schemas() -> dict[str, str]:
    """File name -> canonical JSON text, one file per model."""
    return {
        f"{name}.schema.json": json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"
        for name, model in {**SCHEMA_MODELS, **REPORT_MODELS}.items()
    }


def write_schemas(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_schemas().items():
        path = folder / name
        path.write_text(text)
        written.append(path)
    return written


def schema_drift(folder: Path) -> list[str]:
    """Names of committed schema files that differ from the models (or are missing/extra)."""
    expected = render_schemas()
    drift = [n for n, t in expected.items() if not (folder / n).is_file() or (folder / n).read_text() != t]
    drift += [p.name for p in folder.glob("*.schema.json") if p.name not in expected]
    return sorted(drift)
