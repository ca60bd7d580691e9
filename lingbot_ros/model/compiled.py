"""A function compiled by torch.compile once per call signature, in a bounded cache that never fails.

Dynamo keeps every compiled variant of a function on its code object and, with
``fullgraph=True``, raises once that code object has ``recompile_limit`` (8) variants. A
long-running node meets more than 8: block halves with and without RoPE (two RoPE ranks), with
and without q/k norm, per image size, per dtype and autocast state, each reconfiguration again.
Here every signature gets its own copy of the code object, so Dynamo's limit counts the variants
of one signature only (normally one); the least recently used signatures beyond ``max_variants``
are dropped (their compiled code with them), and a variant that still reaches Dynamo's limit runs
eagerly from then on instead of failing.
"""
from __future__ import annotations

import collections
import logging
import types
from typing import Callable, Hashable

import torch
from torch._dynamo.exc import FailOnRecompileLimitHit

log = logging.getLogger(__name__)

# Distinct signatures kept compiled per function: a session uses ~4 per image size and dtype.
MAX_VARIANTS = 32


def _code_copy(fn: Callable) -> Callable:
    """The same function over a new code object (Dynamo's cache and limit are per code object)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)


class CompiledBySignature:
    """``fn`` compiled per ``signature(*args)`` (hashable; equal signatures must mean that one
    compiled graph serves both calls, as Dynamo's guards would decide)."""

    def __init__(self, fn: Callable, signature: Callable[..., Hashable], max_variants: int = MAX_VARIANTS,
                 **compile_options):
        self.fn, self.signature, self.max_variants = fn, signature, max_variants
        self.compile_options = compile_options
        self._variants: collections.OrderedDict[Hashable, Callable] = collections.OrderedDict()

    @property
    def variants(self) -> int:
        return len(self._variants)

    def __call__(self, *args):
        key = self.signature(*args)
        variant = self._variants.get(key)
        if variant is None:
            variant = self._variants[key] = torch.compile(_code_copy(self.fn), **self.compile_options)
            if len(self._variants) > self.max_variants:
                self._variants.popitem(last=False)
        else:
            self._variants.move_to_end(key)
        try:
            return variant(*args)
        except FailOnRecompileLimitHit:
            # Guards the signature does not cover kept changing: correct eager code beats a failure.
            log.warning("%s: signature %s recompiled past Dynamo's limit; it runs eagerly from now on",
                        self.fn.__qualname__, key)
            self._variants[key] = self.fn
            return self.fn(*args)
