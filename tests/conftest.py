"""Test session setup: 8 simulated CPU devices, fixed before JAX starts; float64 for the
tests that ask for it (``@pytest.mark.float64``), float32 for the rest.

The suite compiles hundreds of tiny programs, and compiling is most of its time, so it asks
XLA for little optimisation work (``jax_disable_most_optimizations``; XLA:CPU's older fusion
code generator, which compiles the suite's programs about twice as fast; and code generated in
one piece rather than split for parallel compilation, about a tenth faster on two cores): in this
process, and through the environment in every CLI it starts, so that an in-process run and
a CLI run of one config compute bit for bit alike. All three are code-generation choices, not
other arithmetic; users' runs keep XLA's defaults, and the README's run, which reproduces
the recorded results digit for digit, is where those are checked. The trainer's runs turn
x64 off (``tests/runs.py``: ``run_numerics``), as users' runs have it."""

import os

os.environ["JAX_PLATFORMS"] = "cpu"
# Room in XLA:CPU's shared pool for every simulated device's in-flight collectives
# (see launch/devices.py: simulated_cpu_env).
os.environ.setdefault("NPROC", "32")
from loire_jax.cli.devices import FAST_COMPILE_CPU_FLAGS  # noqa: E402 (imports no JAX: the flags come first)

for _flag in ("--xla_force_host_platform_device_count=8", "--xla_cpu_collective_call_terminate_timeout_seconds=300",
              *FAST_COMPILE_CPU_FLAGS):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
# See the docstring. Set before JAX reads its environment, so that JAX parses it here as in the
# CLIs the tests start, and both use one setting (JAX_DISABLE_MOST_OPTIMIZATIONS=0 turns it off).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

# One persistent compilation cache for the session's CLI runs (separate processes that compile
# the same programs again and again), kept out of the user's ~/.cache; launch/devices.py
# gives each process layout and process its own directory in it. Each test worker has its own
# directory too, so that no worker loads a program another process compiled: JAX's cache key
# does not tell apart processes with other device counts.
import tempfile  # noqa: E402

import jax  # noqa: E402

_CACHE = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                               os.path.join(tempfile.gettempdir(), f"loire-tests-xla-{os.getuid()}"))
jax.config.update("jax_compilation_cache_dir",
                  os.path.join(_CACHE, "test-workers", os.environ.get("PYTEST_XDIST_WORKER", "main")))
jax.config.update("jax_compilation_cache_max_size", 4 << 30)  # a limit makes JAX lock its entries

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "loire",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile("loire")


import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "float64: the test computes in float64 (jax_enable_x64 on for it alone)")
    _share_one_cpu_peak(config)


def _share_one_cpu_peak(config) -> None:
    """A parallel session's CPU peak for MFU, measured once by the controlling process before
    its workers start and handed to them and to every CLI run through the environment, as a
    suite's launcher would: each process measured its own at its start, about a second of two
    busy cores, 42 times a slow tier. A run in one process (-n 0) measures it where needed."""
    from loire_jax.analysis.flops import PEAK_ENV, measured_matmul_flops

    try:
        parallel = bool(config.getoption("numprocesses"))
    except ValueError:  # -p no:xdist
        parallel = False
    if parallel and "PYTEST_XDIST_WORKER" not in os.environ and not os.environ.get(PEAK_ENV):
        os.environ[PEAK_ENV] = repr(measured_matmul_flops())


@pytest.fixture(autouse=True)
def _float64_if_asked(request):
    if request.node.get_closest_marker("float64"):
        with jax.enable_x64(True):
            yield
    else:
        yield


@pytest.fixture(scope="module")
def highest_precision():
    """Function-preservation comparisons run at full matmul precision: on a GPU, float32
    matmuls would otherwise run in TF32, whose rounding is not a growth error."""
    with jax.default_matmul_precision("highest"):
        yield


# --------------------------------------------------------------------------- the trainer's reference run
# Shared by tests/test_trainer.py and tests/test_multiprocess.py (both in xdist group "engine",
# so one worker computes it once). Session scope: xdist may interleave modules.
@pytest.fixture(scope="session")
def run_config(tmp_path_factory):
    """A two-stage run on 4 devices (each of the two-process tests' processes holds 2): hidden and
    layer growth, distillation, replay, gate ramp. Not 8: on a 2-core machine a run over 8 simulated
    devices took 1.5 to 1.7 times as long as over 2 (CONTRIBUTING.md, "Measured times"), and every
    dimension of this model that 8 divides, and the fsdp rules so shard, 4 divides too."""
    import yaml
    from data_helpers import tiny_config_dict
    from runs import tiny_run

    base = tmp_path_factory.mktemp("engine")
    config = tiny_run(tiny_config_dict(base / "data"), "e2e", "4", eval={"every": 3, "batches": 2}, stages=[
        {"name": "A", "domains": ["SCI"], "steps": 6},
        {"name": "B", "domains": ["NEWS"], "steps": 6,
         "growth": [{"op": "hidden", "size": 32}, {"op": "layers", "size": 2}],
         "warmup_steps": 3, "gate_ramp_steps": 3, "teachers": "all", "replay_ratio": 0.2,
         "beta": 0.1, "beta_steps": 2, "recovery": "start"},  # recovery: end is tests/test_recovery_end.py's
    ])
    path = base / "e2e.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="session")
def reference(run_config, tmp_path_factory):
    """The run, undisturbed, in this process through the library (with its report)."""
    from runs import in_process

    from loire_jax.analysis.reports import write_report

    workdir = tmp_path_factory.mktemp("reference")
    assert in_process(run_config, workdir).complete
    write_report([workdir])
    return workdir


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Each module's compiled programs are dropped when it ends: JAX keeps every executable of
    a live function, and over the whole suite a worker grew to ~5 GB, close to what a 2-core
    CI machine has for two workers and their subprocesses."""
    yield
    import gc

    jax.clear_caches()
    gc.collect()
