"""Analysis: the paper's metrics and everything read back from a run's records.

Owns AP and AP+ (``metrics``), FLOPs and peak throughput (``flops``), memory estimates
(``memory``), the metrics file format (``records``), a run's report (``reports``; its plots
``report_plots``, where its numbers come from: tokenizer and pretrained M1, ``run_origin``), the
markdown tables every report shares (``tables``) and the comparison of systems: what each
run measured (``suite_results``), the paper's claims and their verdicts (``claims``), and
the report (``comparison``).

May import: ``config``, ``errors``, ``paths``, jax (device queries), matplotlib.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("average_perplexity", "average_increased_perplexity", "lifelong_metrics"), "metrics"),
    **dict.fromkeys(("train_flops_per_token", "stage_flops"), "flops"),
    **dict.fromkeys(("METRICS_FILE", "read_records"), "records"),
    **dict.fromkeys(("write_report", "ReportError"), "reports"),
    "OutOfMemory": "memory",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
