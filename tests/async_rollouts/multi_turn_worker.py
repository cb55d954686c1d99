"""One rank of ``test_multi_turn``'s two-process run (torchrun, gloo): environments on the generator process at
``k = 1``, each rank with its own worker and episodes. Writes what the rank checked and its final weights' sum."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from conftest import scored_batches  # noqa: E402
from test_multi_turn import (  # noqa: E402
    RowEpisodes,
    _check_two_turn_samples,
    _first_turn_is_the_call,
    _trainer,
)


def main(out_dir: str) -> None:
    trainer, call, seen = _trainer(Path(out_dir), "process-k1", "environment", RowEpisodes, max_steps=3)
    rank = trainer.accelerator.process_index
    _first_turn_is_the_call(trainer, call)
    batches, weights_at_step = scored_batches(trainer)
    trainer.train()
    # this rank's rows: its own episodes, answered by its own instances, its later turns by its own worker
    _check_two_turn_samples(trainer, batches, weights_at_step, seen, call, "environment", 1)
    report = {
        "processes": trainer.accelerator.num_processes,
        "episodes": sorted({record["episode"][0] for record in seen}),
        "weights": sum(float(p.detach().double().sum()) for p in trainer.model.parameters()),
        "worker_left": trainer.async_rollouts.pipeline._generator is not None,
    }
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
