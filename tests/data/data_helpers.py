"""Shared helpers of the data tests (fixture paths and a tiny config)."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def local_domain(name: str, path: str, **extra) -> dict:
    return {"name": name, "source": {"kind": "local", "paths": [str(FIXTURES / path)], **extra}}


def tiny_config_dict(data_dir: Path, **overrides) -> dict:
    """Three small local domains; a trained BPE small enough for the fixture text."""
    d = {
        "data_dir": str(data_dir),
        "tokenizer": {"kind": "trained_bpe", "vocab_size": 320},
        "validation_docs": 10,
        "split_seed": 0,
        "recovery_fraction": 0.1,
        "domains": [local_domain("SCI", "science.txt"), local_domain("NEWS", "news.jsonl"),
                    local_domain("REV", "reviews.txt")],
    }
    d.update(overrides)
    return d
