"""TorchrunPlace: this process's place when torchrun (torch.distributed.run) started it, read from
the environment torchrun sets — RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, and MASTER_ADDR / MASTER_PORT,
where the ranks meet through env://. Under torchrun every rank is already a process: `corellm
serve` runs the engine (and the HTTP server) in rank 0 and the worker loop in the others, instead
of spawning the workers itself."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class TorchrunPlace:
    rank: int
    world_size: int
    local_world_size: int  # ranks on this machine

    @property
    def nnodes(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def node_rank(self) -> int:
        return self.rank // self.local_world_size

    @staticmethod
    def from_environment() -> TorchrunPlace | None:
        """The place torchrun gave this process, or None when torchrun did not start it."""
        if "TORCHELASTIC_RUN_ID" not in os.environ:
            return None
        try:
            place = TorchrunPlace(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                                  int(os.environ["LOCAL_WORLD_SIZE"]))
        except (KeyError, ValueError) as e:
            raise ValueError(f"torchrun's environment lacks or garbles {e}: RANK, WORLD_SIZE and LOCAL_WORLD_SIZE "
                             f"must be integers") from None
        if place.world_size % place.local_world_size:
            raise ValueError(f"torchrun: WORLD_SIZE {place.world_size} is not a multiple of LOCAL_WORLD_SIZE "
                             f"{place.local_world_size}")
        return place
