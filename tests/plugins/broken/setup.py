"""The entry points pyproject.toml cannot list: one per fixture module with a record (conformance_broken/records.py,
standard library only, loaded by path so that building does not import the fixtures)."""

import importlib.util
import sys
from pathlib import Path

from setuptools import setup

spec = importlib.util.spec_from_file_location(
    "_conformance_broken_records", Path(__file__).resolve().parent / "conformance_broken" / "records.py")
records = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(records)

setup(entry_points={group: [f"{name} = {value}" for name, value in eps.items()]
                    for group, eps in records.entry_points().items()})
