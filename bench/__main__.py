"""``python -m bench <suite> [args]``: run one benchmark suite (each module has ``main(argv)``)."""

from __future__ import annotations

import importlib
import sys

#: suite name -> module with a ``main(argv: list[str]) -> int | None``
SUITES = {
    "attention": "worldstream.bench.attention",
    "gpu_attention": "worldstream.bench.gpu_attention",
    "gpu_train": "worldstream.bench.gpu_train",
    "quick": "worldstream.bench.quick",
    "engine": "worldstream.bench.engine",
    "baselines": "worldstream.bench.baselines",
    "e2e": "worldstream.bench.e2e",
    "gpu_wan": "worldstream.bench.gpu_wan",
    "soak": "worldstream.bench.soak",
    "scale": "worldstream.bench.scale",
    "report": "worldstream.bench.report",
    "analyse": "worldstream.bench.analyse",
    "browser": "worldstream.bench.browser",
    "replay": "worldstream.bench.replay",
    "savepoint": "worldstream.bench.savepoint_load",
    "robustness": "worldstream.bench.robustness",
    "matrix_game_cpu": "worldstream.bench.matrix_game_cpu",
    "gpu_matrix_game": "worldstream.bench.gpu_matrix_game",
    "played_client": "worldstream.bench.played_client",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUITES:
        print(f"usage: python -m bench <suite> [args]; suites: {', '.join(sorted(SUITES))}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(SUITES[argv[0]])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
