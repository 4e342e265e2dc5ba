"""A key/value cache for transformers ``generate`` that grows by doubling instead of by concatenation.

Why our own: transformers' ``DynamicLayer.update`` (5.x) does ``torch.cat([keys, new], dim=-2)`` at
every decoding step, copying the whole cache each time: quadratic in the response length. On CPU
that copy was ~40% of the evaluation job's sampling under a profiler (``torch.cat`` 8 of 20 s,
tiny model, 64 sequences x 160 tokens). Here the keys and values live in a buffer that doubles when
full, and ``update`` returns the views ``buffer[..., :n, :]``: the same values, the same shapes, the
attention computed on them is the same (tests/rollout/test_kv_cache.py compares sampled tokens and
logits bit for bit against the default cache), and the copying is linear.

Only where it is known to be exact: on CPU (the lab's and CI's engine; on a GPU the attention kernel
may treat a strided view differently, which no device has checked yet), for models whose every
layer is a plain ``DynamicLayer`` (no sliding windows, no linear attention) and with a transformers
that has the layered cache API (5.x); :func:`growing_cache` returns None elsewhere and ``generate``
builds its default cache.
"""

from __future__ import annotations

import functools
from typing import Any

MIN_CAPACITY = 64  # positions allocated at first; then doubled when full


def cache_kwargs(model: Any, device: Any) -> dict[str, Any]:
    """``generate``'s keyword for a fresh :func:`growing_cache` (``cache`` since transformers 5.24,
    ``past_key_values`` before), or {} where the default cache stays."""
    cache = growing_cache(model, device)
    if cache is None:
        return {}
    from transformers.generation import utils

    return {"cache" if "cache" in getattr(utils, "ALL_CACHE_NAMES", ()) else "past_key_values": cache}


def growing_cache(model: Any, device: Any) -> Any | None:
    """A ``DynamicCache`` for ``model`` whose layers grow by doubling, or None where the default
    cache must stay (not CPU, a layer type other than ``DynamicLayer``, transformers without
    layered caches)."""
    if getattr(device, "type", str(device)) != "cpu":
        return None
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:  # transformers 4.x: no layered cache
        return None
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # a DynamicCache without the config argument
        return None
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    cache.layers = [_growing_layer_class()() for _ in layers]
    return cache


@functools.cache
def _growing_layer_class() -> type:
    """GrowingLayer, defined on first use (transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A ``DynamicLayer`` whose ``keys``/``values`` [B, H, n, D] are views of buffers
        [B, H, capacity, D]. Methods that replace ``keys`` (crop, batch selection, beam reordering)
        still work: the next ``update`` sees that ``keys`` is no longer its view and starts a new
        buffer from it."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._buffers: tuple[Any, Any] | None = None

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            """key_states, value_states: [B, H, q, D] for q new positions; -> the cached [B, H, n, D]."""
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            old = self.get_seq_length()
            ours = (
                self._buffers is not None and old > 0 and self.keys.data_ptr() == self._buffers[0].data_ptr()
            )
            if not ours or self.keys.shape[:-2] != key_states.shape[:-2]:
                self._buffers = None  # a method replaced keys (or nothing is cached yet)
            n = old + key_states.shape[-2]
            if self._buffers is None or n > self._buffers[0].shape[-2]:
                capacity = max(MIN_CAPACITY, 2 * n)
                grown = tuple(
                    t.new_empty(*t.shape[:-2], capacity, t.shape[-1]) for t in (key_states, value_states)
                )
                if old:
                    grown[0][..., :old, :] = self.keys
                    grown[1][..., :old, :] = self.values
                self._buffers = grown
            keys, values = self._buffers
            keys[..., old:n, :] = key_states
            values[..., old:n, :] = value_states
            self.keys, self.values = keys[..., :n, :], values[..., :n, :]
            return self.keys, self.values

        def reset(self) -> None:
            self._buffers = None
            super().reset()

    return GrowingLayer
