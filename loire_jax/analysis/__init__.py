"""Analysis: the paper's metrics and everything read back from a run's records.

Owns AP and AP+ (``metrics``), FLOPs and peak throughput (``flops``), memory estimates
(``memory``), the metrics file format (``records``), a run's report (``reports``; its plots
``report_plots``, where its numbers come from: tokenizer and pretrained M1, ``run_origin``), the
markdown tables every report shares (``tables``) and the comparison of systems: what each
run measured (``suite_results``), the paper's claims and their verdicts (``claims``), each
under both readings of the recovery window (``readings``), the paper's own FLOPs accounting
(``paper_flops``), and the report (``comparison``).

May import: ``config``, ``errors``, ``paths``, jax (device queries), matplotlib.
"""

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.analysis.flops import stage_flops as stage_flops
    from loire_jax.analysis.flops import train_flops_per_token as train_flops_per_token
    from loire_jax.analysis.memory import OutOfMemory as OutOfMemory
    from loire_jax.analysis.metrics import average_increased_perplexity as average_increased_perplexity
    from loire_jax.analysis.metrics import average_perplexity as average_perplexity
    from loire_jax.analysis.metrics import lifelong_metrics as lifelong_metrics
    from loire_jax.analysis.records import METRICS_FILE as METRICS_FILE
    from loire_jax.analysis.records import read_records as read_records
    from loire_jax.analysis.reports import ReportError as ReportError
    from loire_jax.analysis.reports import write_report as write_report

__getattr__, __dir__ = lazy_exports(__name__, __file__)
