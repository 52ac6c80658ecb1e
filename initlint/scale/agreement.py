"""The ranks of a sharded audit agree that every rank is still going before each collective.

A collective pairs the n-th call of every rank. If one rank's probe raises (an out-of-memory
error on one device, a local batch the model refuses) while the others go on, the others wait
in their next collective for the whole process-group timeout, or pair it with a different
collective of the failing rank, whose sizes differ: gloo then aborts the process. So the sharded
probe calls :meth:`Agreement.check` before each of its collectives, and a rank whose probe raised
calls :meth:`Agreement.fail` instead, once: that pairs with the others' next check. Both are the
same fixed-size collective (one status per rank, then, only when some rank failed, a fixed-size
row of text per rank), so they pair up whoever calls which, and every rank ends with the same
sentence naming the rank that failed and its error.

That holds as long as no rank can fail between a check and the collectives it guards, which
run initlint's own code on sizes every rank shares (weight shapes; statistics whose keys were
compared first).
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist


_ROW = 1024
"""Bytes of text per rank when some rank failed: the stage, the short reason and the message, cut to fit."""
_OK, _FAILED, _FINAL = 0, 1, 2
"""A rank's status: going on, failed, or failed with one of initlint's own errors (no other capture would help)."""


class RanksFailed(Exception):
    """Some rank's probe failed: every rank raises this at the same point, with the same sentence.

    ``reason`` is the short form (the exception's type and first line) for a note; ``final`` is
    true when a rank failed with one of initlint's own errors, which no other capture changes."""

    def __init__(self, sentence: str, reason: str, final: bool) -> None:
        super().__init__(sentence)
        self.sentence, self.reason, self.final = sentence, reason, final


class Agreement:
    """One status per rank, exchanged over ``groups`` (the meshes' process groups, in turn) on ``device``."""

    def __init__(self, groups: List[Any], device: torch.device) -> None:
        self.groups = groups
        self.device = device
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        members = set()
        for group in groups:
            members.update(dist.get_process_group_ranks(group))
        self.members = len(members)
        self.stage = "preparing its probe batch"
        """What this rank is doing, named in the sentence when it fails here."""
        self.failure: Optional[RanksFailed] = None
        """The agreed failure, once the ranks have exchanged it (no collective runs after that)."""

    def reset(self) -> None:
        """A new attempt (the runtime capture after the fx one): every rank is going again."""
        if self.failure is not None and not self.failure.final:
            self.failure = None

    def check(self) -> None:
        """Before a collective: raise the agreed :class:`RanksFailed` if some rank has failed."""
        self._exchange(_OK, "", "")
        if self.failure is not None:
            raise self.failure

    def fail(self, reason: str, message: str, final: bool) -> RanksFailed:
        """This rank's probe raised: tell the others at their next check (once), and return the agreed failure."""
        if self.failure is None:
            self._exchange(_FINAL if final else _FAILED, reason, message)
        assert self.failure is not None
        return self.failure

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on some rank."""
        t = torch.tensor([int(flag)], dtype=torch.int32, device=self.device)
        self._max(t, "the comparison of the ranks' captures")
        return bool(t.item())

    # -- internals
    def _exchange(self, status: int, reason: str, message: str) -> None:
        if self.failure is not None:
            return
        statuses = torch.zeros(self.world, dtype=torch.int32, device=self.device)
        statuses[self.rank] = status
        self._max(statuses, self.stage)
        if not bool(statuses.any()):
            return
        rows = torch.zeros(self.world, _ROW, dtype=torch.uint8, device=self.device)
        if status != _OK:
            text = "\n".join((self.stage, reason, message.replace("\n", " "))).encode()[:_ROW]
            rows[self.rank, :len(text)] = torch.tensor(list(text), dtype=torch.uint8)
        self._max(rows, self.stage)
        failed = [(r, int(s), _decode(rows[r])) for r, s in enumerate(statuses.tolist()) if s != _OK]
        self.failure = _sentence(failed, self.members, self.world)

    def _max(self, t: torch.Tensor, stage: str) -> None:
        """Elementwise maximum over every rank of the groups (each group in turn: max is idempotent)."""
        try:
            for group in self.groups:
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        except RuntimeError as exc:  # most often a rank has gone (its process ended or was killed)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self.failure = RanksFailed(f"rank {self.rank} of {self.world} could not reach the other ranks in "
                                       f"{stage} ({type(exc).__name__}: {first}); if another rank stopped, its "
                                       f"own output says why", f"{type(exc).__name__}: {first}", True)
            raise self.failure from None


def _decode(row: torch.Tensor) -> Tuple[str, str, str]:
    text = bytes(row.tolist()).rstrip(b"\0").decode("utf-8", errors="ignore")
    stage, reason, message = (text.split("\n", 2) + ["", ""])[:3]
    return stage, reason, message


def _sentence(failed: List[Tuple[int, int, Tuple[str, str, str]]], members: int, world: int) -> RanksFailed:
    """One sentence for every rank: the error itself when every rank failed alike, else the first failing rank's."""
    final = any(status == _FINAL for _, status, _ in failed)
    first, _, (stage, reason, message) = failed[0]
    if len(failed) == members and all(text == failed[0][2] for _, _, text in failed):
        return RanksFailed(message, reason, final)
    others = [str(r) for r, _, _ in failed[1:]]
    also = f" (rank{'s' if len(others) > 1 else ''} {', '.join(others)} failed too)" if others else ""
    return RanksFailed(f"rank {first} of {world} failed in {stage}: {message}{also}", f"rank {first}: {reason}",
                       final)
