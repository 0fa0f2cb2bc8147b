"""Only what setup.cfg cannot say: the repository's ``configs/`` ships inside the package as
``loire_jax/presets`` (found by name: ``loire-train --config tiny``; see loire_jax/presets.py)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["loire_jax", "loire_jax.*"]), "loire_jax.presets"],
    package_dir={"loire_jax.presets": "configs"},
    package_data={"loire_jax.presets": ["*.yaml", "domains/*.yaml", "suites/*.yaml", "tasks/*.yaml"]},
)
