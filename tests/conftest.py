"""Shared test helpers."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def load_script():
    """Import a script of the repository (not a package module) by its path from the repository root,
    e.g. ``load_script("benchmarks/streaming_bound.py")``; returns the module."""
    def load(relpath: str):
        path = ROOT / relpath
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    return load
