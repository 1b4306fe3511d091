"""Defaults of the ``pathdask.*`` dask config namespace, loaded from ``pathdask.yaml``."""

from __future__ import annotations

import os

import dask.config
import yaml

_path = os.path.join(os.path.dirname(__file__), "pathdask.yaml")
with open(_path) as f:
    defaults = yaml.safe_load(f)

dask.config.update_defaults(defaults)
