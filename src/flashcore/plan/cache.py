"""The one plan cache: plan key (``flashcore.problem``) -> :class:`~flashcore.plan.build.Plan`.

A key holds every public fact a plan depends on and every knob (``knobs.snapshot``), so an entry never
goes stale and nothing needs clearing when a knob changes. Reads are lock-free (a dict lookup under the
GIL); inserts take a lock, so threads planning the same key concurrently keep one plan. At ``limit`` plans
the oldest goes: a KV cache that grows by a token per step (transformers' DynamicCache) makes a key per
length, and a server would otherwise stop caching once it had seen ``limit`` lengths. The class also serves as the
bounded cache of the KV-cache path's shared tensors (``plan.decode.lengths_tensor``, ``plan.decode.workspace``)."""
from __future__ import annotations

import threading


class PlanCache:
    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._plans: dict = {}
        self._lock = threading.Lock()

    def get(self, key):
        return self._plans.get(key)

    def put(self, key, plan):
        """Keep ``plan`` under ``key`` (the one already there wins); returns the plan to use."""
        with self._lock:
            kept = self._plans.get(key)
            if kept is not None:
                return kept
            while len(self._plans) >= self.limit > 0:
                self._plans.pop(next(iter(self._plans)))  # the oldest insert (dicts keep insertion order)
            if self.limit > 0:
                self._plans[key] = plan
        return plan

    def get_or_build(self, key, build):
        """The plan under ``key``, or ``build()``'s, kept under ``key`` (None: a call that cannot be keyed, planned
        afresh and not kept)."""
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            plan = build()
            if key is not None:
                plan = self.put(key, plan)
        return plan

    def plans(self) -> list:
        """The cached plans, oldest first (a snapshot, for inspection)."""
        with self._lock:
            return list(self._plans.values())

    def clear(self) -> None:
        """Forget every plan (their compiled kernels stay in Triton's own cache)."""
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


PLANS = PlanCache()
