"""Test setup for the data subsystem: 8 CPU devices, offline fixtures.

The environment must be set before jax is first imported; the top-level conftest does the
same, and setdefault keeps whichever came first.
"""

import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=8").strip()

REPO = Path(__file__).resolve().parents[2]

import pytest  # noqa: E402
from data_helpers import tiny_config_dict  # noqa: E402


@pytest.fixture(scope="session")
def tiny_cfg(tmp_path_factory):
    from loire_jax.config.loader import data_config_from_dict
    from loire_jax.data import prepare

    cfg = data_config_from_dict(tiny_config_dict(tmp_path_factory.mktemp("tiny_data")))
    prepare(cfg, progress=False)
    return cfg
