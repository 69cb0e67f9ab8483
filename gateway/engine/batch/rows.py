"""A batch's rows: one request inside a batch (`Row`), what a step hands back for it
(`Event`), a row taken out of its batch to go on later (`Parked`), and the mark a decoding
step leaves for the next one's overhead (`StepMark`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.engine.batch.slots import Saved
from gateway.engine.loop import LoopConfig, RowTimes
from gateway.engine.schema import Delta, Finished

Event = Delta | Finished | Exception  # an Exception ends its row: the consumer raises it


@dataclass
class Row:
    """One request inside a batch."""

    cfg: LoopConfig
    cancelled: Callable[[], bool] | None
    slot: int
    ctx: list[int]
    t_start: float = field(default_factory=time.perf_counter)
    times: RowTimes = field(default_factory=RowTimes)
    prefilled: int = 0  # prompt tokens already in the slot (all but the last get there)
    forwards: int = 0
    decode_forwards: int = 0  # read by loop._measure_c, like TargetRunner's
    decode_forward_s: float = 0.0
    finished: bool = False

    @property
    def prefilling(self) -> bool:
        """Prompt tokens (all but the last) not yet in the slot."""
        return self.prefilled < len(self.cfg.prompt_ids) - 1


@dataclass(frozen=True)
class Parked:
    """A row out of its batch (scheduler.py `Batch.park`): its request's state, and its
    committed keys and values outside the slot buffers until `Batch.resume`."""

    row: Row
    saved: Saved

    @property
    def nbytes(self) -> int:
        return self.saved.nbytes


@dataclass(frozen=True)
class StepMark:
    """A decoding step, for the overhead measured at the next one's start."""

    started: float
    rows: int  # rows that decoded
    drafted: bool  # any of them drafted
    forward_s: float  # its forwards, target and draft


def failed(row: Row, exc: Exception) -> Exception:
    """`exc` as the row's last event: the row is finished."""
    row.finished = True
    return exc
