"""Whose adapter the policy holds, at which version, and the Adam moments of the owners it left.

A step trains one owner's adapter (a user's, or the shared one: owner None). Turning the policy to
another owner keeps the leaving owner's optimizer moments and puts back the arriving owner's only
if they were built on the very weights loaded now; a fresh Adam would take sign-sized first steps
every time owners alternate. Restoring a version (after a refused step, or a rollback made
elsewhere) loads its weights and forgets the moments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.checkpoints import Version
from trainer.policy import Policy, load_version_into, unwrap


class Holding:
    """The policy's weights as owner + version, and the moments saved per owner."""

    def __init__(self, policy: Policy, optimizer: Any, base_dir: Path, fresh: dict[str, torch.Tensor] | None,
                 current: Version):
        self.policy = policy
        self.optimizer = optimizer
        self.base_dir = base_dir
        self.fresh = fresh  # a fresh LoRA's initial weights: what an owner with no adapter starts from
        self.owner: str | None = None  # None: the shared adapter
        self.current = current
        self.moments: dict[str | None, tuple[int, dict[str, Any]]] = {}  # owner -> (version, Adam state)

    def _adam(self) -> Any:
        return getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate wraps it

    def restore(self, version: Version) -> None:
        """Put ``version``'s weights back into the policy and forget the optimizer's moments."""
        from accelerate.utils import DistributedType

        sharded = self.policy.accelerator.distributed_type == DistributedType.FSDP
        load_version_into(unwrap(self.policy.model), version, self.base_dir, sharded=sharded, fresh=self.fresh)
        self.optimizer.zero_grad(set_to_none=True)
        self._adam().state.clear()
        self.current = version

    def switch(self, owner: str | None, version: Version) -> None:
        """Turn the policy to ``owner``'s adapter at ``version`` (``current_version``: their own
        newest, else the shared one's if they share, else fresh)."""
        adam = self._adam()
        if adam.state:
            state = adam.state_dict()
            state["state"] = {i: {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v
                                  for k, v in st.items()} for i, st in state["state"].items()}
            self.moments[self.owner] = (self.current.version, state)
        self.restore(version)
        saved = self.moments.pop(owner, None)
        if saved is not None and saved[0] == version.version:
            adam.load_state_dict(saved[1])  # moved back onto each parameter's device
        self.owner = owner
        self.policy.teacher.restart()

    def forget_owner(self) -> None:
        """Drop a removed user's weights and moments: the policy serves nobody until the next switch."""
        self._adam().state.clear()
        self.moments.pop(self.owner, None)
        self.owner = None
        self.current = Version(-1, self.base_dir, self.current.format)

    def keep_moments_of(self, owners: tuple[str | None, ...]) -> None:
        """Forget the saved moments of owners that are gone (a removed user)."""
        for gone in set(self.moments) - set(owners):
            del self.moments[gone]
