"""Hugging Face models by hub id (``gpt2``, ``org/name``, ``org/name@revision``): downloaded
with ``huggingface_hub`` into its cache, and named by the commit they resolved to.

A module of its own because it is the one place that touches the network: everything after
it (``hf.load``, ``init_from``'s checks) reads a local directory. A local path always wins: a
string is a hub id only if nothing exists at that path, it does not start with ``.``, ``/``
or ``~``, it holds no ``://``, and it has a hub id's form. ``huggingface_hub`` is optional
(the ``hf`` extra); without it, offline, or for an id the Hub does not know, the error is one
line naming the local-directory route. Progress is ``huggingface_hub``'s own bars.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from loire_jax.errors import LoireError

# What a checkpoint directory needs: the config, the weights (an index too), the tokenizer
# files and the identity an export writes (loire_jax.interop.hf_format.TOKENIZER_IDENTITY).
PATTERNS = ("config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model",
            "loire_tokenizer.json")
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"  # the Hub's rule for an org or a model name
_ID = re.compile(rf"(?P<repo>{_NAME}(?:/{_NAME})?)(?:@(?P<revision>[A-Za-z0-9._][A-Za-z0-9._/-]*))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")


class HubError(LoireError, ValueError):
    """A hub id that cannot be resolved here; the message names the local-directory route."""


@dataclasses.dataclass(frozen=True)
class HubId:
    """A model on the Hub; ``revision`` None is its default branch."""

    repo: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "")


def parse(source: str | os.PathLike) -> HubId | None:
    """The hub id ``source`` names, or None for a path (existing or not, local or a URI)."""
    text = os.fspath(source)
    if not text or text[0] in "./~" or "://" in text or "\\" in text:
        return None
    if os.path.lexists(os.path.expanduser(text)):
        return None
    match = _ID.fullmatch(text)
    if match is None or ".." in match["repo"] or "--" in match["repo"]:
        return None
    return HubId(match["repo"], match["revision"])


def local_route(hub_id: HubId, route: str) -> str:
    """How to get ``hub_id`` as a directory without this process reaching the Hub."""
    return (f"download it where there is a network (`hf download {hub_id.repo}"
            + (f" --revision {hub_id.revision}" if hub_id.revision else "")
            + f" --include '*.json' --include '*.safetensors' --local-dir DIR`) and pass the directory: {route}")


def download(hub_id: HubId, *, where: str, route: str) -> tuple[Path, str]:
    """``(directory, commit)``: ``hub_id``'s checkpoint files in the Hugging Face cache (a
    cached snapshot serves offline), and the commit its revision resolved to. ``where``
    starts every message; ``route`` shows how to pass a directory instead (``init_from=DIR``)."""
    try:
        import huggingface_hub
        from huggingface_hub import constants, errors
    except ImportError:
        raise HubError(f"{where}: no such local path; downloading the Hugging Face model {hub_id} needs "
                       f"huggingface_hub (pip install -e '.[hf]'), or {local_route(hub_id, route)}") from None
    try:
        folder = huggingface_hub.snapshot_download(hub_id.repo, revision=hub_id.revision,
                                                   allow_patterns=list(PATTERNS))
    except errors.RevisionNotFoundError:
        raise HubError(f"{where}: the Hugging Face model {hub_id.repo} has no revision {hub_id.revision!r}; "
                       "name a branch, a tag or a commit it has") from None
    except errors.RepositoryNotFoundError:  # gated and private ones too
        raise HubError(f"{where}: no such local path, and no Hugging Face model {hub_id.repo} that this "
                       "host may read (a private or gated one needs `hf auth login`); for a path, write it "
                       f"as ./{hub_id}") from None
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled, errors.HfHubHTTPError) as err:
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else \
            f"{type(err).__name__}: {str(err).splitlines()[0][:100] if str(err) else 'no network'}"
        raise HubError(f"{where}: no such local path, and cannot reach the Hugging Face Hub ({why}) to download "
                       f"{hub_id}, which its cache lacks; {local_route(hub_id, route)}") from None
    commit = Path(folder).name  # the cache's snapshots/<commit>
    if not _COMMIT.fullmatch(commit):
        raise HubError(f"{where}: huggingface_hub gave {folder}, not a snapshots/<commit> directory of its cache, "
                       f"so the revision cannot be pinned; {local_route(hub_id, route)}")
    return Path(folder), commit


def checkpoint_dir(path: str | os.PathLike) -> Path:
    """``path`` as a local directory (``hf.load``'s): itself, or the hub id it names, downloaded."""
    hub_id = parse(path)
    if hub_id is None:
        return Path(path).expanduser()
    return download(hub_id, where=f"load {hub_id}", route="load('DIR')")[0]
