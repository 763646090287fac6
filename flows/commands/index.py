"""``python -m flows.commands.index [overrides]``: build or update the chosen method's index, no evaluation.

On a grown or shrunk corpus this *is* the update path: per-document stages (chunk, NER, embed)
compute only new documents, global structures are rebuilt from the stored per-document tables.
The last line printed is ``index: {json}``. The flow itself is :func:`flows.runtime.pipeline.index_flow`, which
``open_index(build=True)`` runs too.
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from flows.runtime.pipeline import index_flow, run_command


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point."""
    run_command(index_flow, cfg, "index")


if __name__ == "__main__":
    sys.exit(main())
