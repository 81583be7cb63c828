"""Sweep definitions as YAML: which tasks, learning rates, seeds and epoch ranges a BLUE sweep runs.

A package only so that the YAML files ship with the project: ``sweep.search_space: tiny`` finds
``tiny.yaml`` here in a clone and after ``pip install .`` alike (``SPACE_DIR``).
"""
from pathlib import Path

SPACE_DIR = Path(__file__).resolve().parent
