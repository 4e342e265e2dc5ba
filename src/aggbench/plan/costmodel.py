"""Arithmetic cost model of a decoder-only model: parameters, memory per GPU, FLOPs per token.

Pure Python on a model's architecture (the numbers of a Hugging Face ``config.json``), so
``aggbench plan`` costs a grid without torch or the weights. It covers the Llama family as
transformers implements it (Llama, Qwen2 with q/k/v biases, Qwen3 with q/k RMSNorm): SwiGLU MLP,
grouped-query attention, RMSNorm, RoPE. ``tests/plan/test_plan.py`` checks every memory term below
against bytes measured on CPU (tiny Llama, Qwen2 and Qwen3 models), not against this file.

Notation: L layers, h hidden size, I intermediate size, H query heads, K key/value heads, d head
dim, V vocabulary, N parameters, W parameters of the matmul weights (every Linear weight,
including the LM head, which is the embedding when tied; not the embedding lookup, norms,
biases). S = FSDP shards = the train job's GPUs. Memory per GPU of a train job, in bytes, for the
trainer as ``aggbench.train.loop`` runs it (fp32 master weights, AdamW, bf16 autocast):

    params       4 N / S      fp32 master weights
    grads        4 N / S      fp32 gradients
    optimizer    8 N / S      AdamW exp_avg and exp_avg_sq, fp32
    weights16    2 W          bf16 copies of the matmul weights that autocast makes in the forward
                              and the backward keeps (S = 1). With FSDP (S > 1) only the unsharded
                              bf16 unit in use and the prefetched next one: 2 x 2 x W_layer.
                              With activation checkpointing: the LM head and one layer, 2 (V h + W_layer).
    activations  (saved for backward, one micro-batch of `mb` rows of P + T tokens, T of them response)
      no checkpointing:  mb (P+T) [L a_layer + a_model] + mb T 8 V
      checkpointing:     mb (P+T) [L 4h + a_head] + mb T 8 V, plus mb (P+T) a_layer while a layer
                         is recomputed in the backward
    logits       mb (P+T) V 2 + mb T V 8     transient around the loss: the bf16 logits and the
                                             fp32 log-softmax gradient

Bytes per token saved for backward (an fp32 residual stream; SDPA or flash attention, which keep
no T x T matrix), with a = 2 under bf16 autocast and 4 in fp32:

    a_layer = 16 h + 8 + c + 2 a d (H + K) + 4 H + 4 a I   [+ (4 + a) d (H + K) + 4 (H + K) with q/k RMSNorm]
      two RMSNorms: fp32 input 4h, rsqrt 4, normalised fp32 4h            -> 16 h + 8
      c: inputs of q, k, v, gate, up: five bf16 casts (10 h); in fp32 the two norm outputs (8 h)
      attention: q and output (a H d each), k and v (a K d each), fp32 log-sum-exp (4 H)
      MLP: gate, up, silu(gate), silu(gate) * up                           -> 4 a I
      q/k RMSNorm (Qwen3): fp32 input 4 d, rsqrt 4, output a d, per head
    a_model = 8 (token ids) + 8 d (RoPE cos and sin, fp32) + a_head
    a_head  = 8 h + 4 (final RMSNorm) + a h (input of the LM head)
    8 V per response token: the fp32 log-softmax and its exp (entropy), as aggbench.train.logprobs keeps them.
  bf16: a_layer = 26 h + 8 I + 4 d (H + K) + 4 H + 8;  fp32: a_layer = 24 h + 16 I + 8 d (H + K) + 4 H + 8.
  weights16 is 0 in fp32 (nothing is cast).

Under FSDP with a bf16 ``param_dtype`` the residual stream is bf16 and the fp32 terms halve, so
for S > 1 these numbers are an upper bound.

KV cache (generation) = 2 x L x K x d x tokens x bytes per element: 2 for vLLM (bf16). The
transformers engine under bf16 autocast caches keys after RoPE in fp32 (4 bytes) and values in
bf16 (2), so it stores L x K x d x (4 + 2) bytes per token.

FLOPs per token at attention context c (tokens attended): forward 2 W + 4 L H d c; training
(forward + backward) 3 x forward (Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
the 6N rule, with the attention term). A GPU's tokens/s = MFU x peak FLOP/s / FLOPs per token.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aggbench.errors import InputError, not_utf8

GIB = 1024**3
PRECISIONS = ("bf16", "fp32")


def _act_bytes(precision: str) -> int:
    """Bytes of an activation element: bf16 autocast 2, fp32 4."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: the cost model knows {', '.join(PRECISIONS)}")
    return 2 if precision == "bf16" else 4


class ShapeError(InputError, ValueError):
    """A model config.json the cost model cannot read: missing, not UTF-8, not JSON, not a decoder's."""


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers that set a model's cost (a subset of its config.json)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    tie_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], where: str = "config.json") -> ModelShape:
        """From a Hugging Face config dict (Llama, Qwen2, Qwen3 and alike); names the missing key."""
        if not isinstance(cfg, dict):
            raise ShapeError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
        cfg = cfg.get("text_config", cfg)
        missing = [
            k
            for k in (
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
                "vocab_size",
            )
            if k not in cfg
        ]
        if missing:
            raise ShapeError(
                f"{where}: missing {', '.join(missing)}; aggbench plan needs a decoder-only "
                "config.json (Llama, Qwen2, Qwen3)"
            )
        try:  # a size that is no integer ("4k", null) or a model_type that is no string
            return cls._from_sizes(cfg)
        except (ValueError, TypeError, ZeroDivisionError, AttributeError) as exc:
            raise ShapeError(f"{where}: not a decoder's sizes ({type(exc).__name__}: {exc})") from None

    @classmethod
    def _from_sizes(cls, cfg: dict[str, Any]) -> ModelShape:
        model_type = cfg.get("model_type", "llama")
        heads = int(cfg["num_attention_heads"])
        return cls(
            hidden=int(cfg["hidden_size"]),
            layers=int(cfg["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            intermediate=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            max_positions=int(cfg.get("max_position_embeddings") or 0),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 has q/k/v biases without saying so in config.json; Llama says attention_bias
            qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type.startswith("qwen3"),
        )

    @classmethod
    def from_file(cls, path: str | Path, *, key: str = "", fix: str = "") -> ModelShape:
        """From a config.json, or a model directory holding one. A file that is missing, not UTF-8,
        not JSON or not a decoder's config raises :class:`ShapeError` naming it, after ``key`` (the
        setting that pointed here) and before ``fix`` (what to do) when they are given."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            if not path.is_file():
                raise ShapeError(f"{path} does not exist (expected a model's config.json)")
            try:
                cfg = json.loads(path.read_text(encoding="utf-8"))
            except UnicodeDecodeError as exc:
                raise ShapeError(f"{path}: {not_utf8(exc)}") from None
            except json.JSONDecodeError as exc:
                raise ShapeError(f"{path} is not valid JSON ({exc})") from None
            return cls.from_hf_config(cfg, str(path))
        except ShapeError as exc:
            message = f"{key}: {exc}" if key else str(exc)
            raise ShapeError(f"{message}; {fix}" if fix else message) from None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    # ---------------------------------------------------------------- parameters
    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_matmul_weights(self) -> int:
        """W_layer: q, k, v, o and gate, up, down projection weights of one decoder layer."""
        h = self.hidden
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + 3 * h * self.intermediate

    def layer_params(self) -> int:
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        return self.layer_matmul_weights() + bias + 2 * self.hidden + qk_norm

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def n_params(self) -> int:
        """N: every parameter once (a tied LM head is the embedding)."""
        head = 0 if self.tie_embeddings else self.embedding_params()
        return self.embedding_params() + self.layers * self.layer_params() + self.hidden + head

    def n_non_embedding(self) -> int:
        """N without the embedding and an untied LM head (how model cards count "non-embedding")."""
        return self.layers * self.layer_params() + self.hidden

    def matmul_weights(self) -> int:
        """W: all Linear weights, the LM head included (tied or not)."""
        return self.layers * self.layer_matmul_weights() + self.vocab * self.hidden

    # ---------------------------------------------------------------- activations
    def activation_bytes_per_layer_token(self, precision: str = "bf16") -> int:
        """a_layer: bytes saved for backward per token per decoder layer (see the module docstring)."""
        a = _act_bytes(precision)
        h, i, d, hq, hk = self.hidden, self.intermediate, self.head_dim, self.heads, self.kv_heads
        linear_inputs = 10 * h if a == 2 else 2 * a * h
        out = 16 * h + 8 + linear_inputs + 2 * a * d * (hq + hk) + 4 * hq + 4 * a * i
        if self.qk_norm:
            out += (4 + a) * d * (hq + hk) + 4 * (hq + hk)
        return out

    def head_bytes_per_token(self, precision: str = "bf16") -> int:
        """a_head: final RMSNorm and the LM head's input."""
        return 8 * self.hidden + 4 + _act_bytes(precision) * self.hidden

    def activation_bytes(
        self,
        micro_batch: int,
        seq_len: int,
        response_len: int,
        *,
        checkpointing: bool = False,
        precision: str = "bf16",
    ) -> int:
        """Bytes saved for backward by one micro-batch (mb rows of seq_len tokens, response_len of
        them response tokens); with ``checkpointing`` only what stays stored (the layer inputs), not
        the layer being recomputed."""
        tokens = micro_batch * seq_len
        logits = micro_batch * response_len * 8 * self.vocab
        head = self.head_bytes_per_token(precision)
        if checkpointing:
            return tokens * (self.layers * 4 * self.hidden + head + 8) + logits
        per_layer = self.activation_bytes_per_layer_token(precision)
        return tokens * (self.layers * per_layer + 8 + 8 * self.head_dim + head) + logits

    def logits_transient_bytes(
        self, micro_batch: int, seq_len: int, response_len: int, precision: str = "bf16"
    ) -> int:
        """Around the loss: the logits of every position and the fp32 log-softmax gradient."""
        a = _act_bytes(precision)
        return micro_batch * (seq_len * self.vocab * a + response_len * self.vocab * 8)

    # ---------------------------------------------------------------- generation
    def kv_bytes_per_token(self, key_bytes: int = 2, value_bytes: int = 2) -> int:
        """KV cache bytes per token: L x K x d x (key bytes + value bytes)."""
        return self.layers * self.kv_dim * (key_bytes + value_bytes)

    # ---------------------------------------------------------------- FLOPs
    def forward_flops_per_token(self, context: float) -> float:
        """2 W + 4 L H d c: matmuls plus attention scores and mixing over c attended tokens."""
        return 2 * self.matmul_weights() + 4 * self.layers * self.q_dim * context

    def train_flops_per_token(self, context: float) -> float:
        """Forward + backward = 3 x forward."""
        return 3 * self.forward_flops_per_token(context)


def train_memory(
    shape: ModelShape,
    *,
    shards: int,
    micro_batch: int,
    seq_len: int,
    response_len: int,
    checkpointing: bool = False,
    precision: str = "bf16",
) -> dict[str, int]:
    """Bytes per GPU of the update phase of a train job, term by term, and their sum ``peak``."""
    n, s = shape.n_params(), max(shards, 1)
    if precision == "fp32":
        weights16 = 0
    elif checkpointing:
        weights16 = 2 * (shape.vocab * shape.hidden + shape.layer_matmul_weights())
    elif s == 1:
        weights16 = 2 * shape.matmul_weights()
    else:
        weights16 = 2 * 2 * max(shape.layer_matmul_weights(), shape.vocab * shape.hidden)
    out = {
        "params": 4 * n // s,
        "grads": 4 * n // s,
        "optimizer": 8 * n // s,
        "weights16": weights16,
        "activations": shape.activation_bytes(
            micro_batch, seq_len, response_len, checkpointing=checkpointing, precision=precision
        ),
        "logits": shape.logits_transient_bytes(micro_batch, seq_len, response_len, precision),
    }
    if checkpointing:  # the layer being recomputed in the backward
        out["recompute"] = micro_batch * seq_len * shape.activation_bytes_per_layer_token(precision)
    out["peak"] = sum(out.values())
    return out


def max_micro_batch(shape: ModelShape, budget_bytes: float, **settings: Any) -> int:
    """Largest micro-batch whose update-phase peak fits ``budget_bytes`` (0 if none does);
    ``settings`` are train_memory's keywords other than micro_batch."""
    fixed = train_memory(shape, micro_batch=0, **settings)["peak"]
    one = train_memory(shape, micro_batch=1, **settings)["peak"] - fixed
    return max(int((budget_bytes - fixed) // one), 0) if one > 0 else 0


def hf_rollout_memory(
    shape: ModelShape, *, shards: int, batch: int, seq_len: int, precision: str = "bf16"
) -> dict[str, int]:
    """Bytes per GPU while transformers ``generate`` samples ``batch`` sequences of up to ``seq_len``
    tokens from the trainer's own weights: params + AdamW state (gradients are freed after each
    step), the bf16 weight copies autocast caches, and the KV cache (keys fp32 after RoPE, values
    bf16 under autocast; both fp32 in fp32)."""
    n, s = shape.n_params(), max(shards, 1)
    key, value = (4, 2) if precision == "bf16" else (4, 4)
    out = {
        "trainer_resident": 12 * n // s,
        "weights16": 2 * shape.matmul_weights() if precision == "bf16" else 0,
        "kv_cache": shape.kv_bytes_per_token(key, value) * seq_len * batch,
    }
    out["peak"] = sum(out.values())
    return out


def mean_context(prompt: float, response: float) -> tuple[float, float]:
    """Average attended tokens (generation per response token, update per token) for one sequence."""
    generate = prompt + response / 2
    update = (prompt + response + 1) / 2
    return generate, update


# --------------------------------------------------------------------------- published architectures
# Used when a model's config.json is not on disk (compute nodes and CI are offline). Numbers as in
# each model's published config.json on the Hugging Face hub, read from Lightning-AI/litgpt
# litgpt/config.py, whose entries cite those files (n_embd, n_layer, n_head, n_query_groups,
# intermediate_size, padded_vocab_size, block_size = max_position_embeddings, attn_bias, norm_qk).
# Tied embeddings: Qwen2.5-7B unties them (Qwen2.5 technical report, arXiv 2412.15115; its model
# card gives 7.61B parameters, 6.53B non-embedding, which only the untied count reproduces);
# Qwen3-1.7B ties them (its model card: 1.7B parameters, 1.4B non-embedding; untied would be 2.0B).
# tests/plan/test_plan.py checks both published totals against ModelShape.n_params().
BUILTIN_SHAPES: dict[str, tuple[ModelShape, str]] = {
    "Qwen/Qwen2.5-Math-7B": (
        ModelShape(
            hidden=3584,
            layers=28,
            heads=28,
            kv_heads=4,
            head_dim=128,
            intermediate=18944,
            vocab=152064,
            max_positions=4096,
            tie_embeddings=False,
            qkv_bias=True,
        ),
        "published config.json of Qwen/Qwen2.5-Math-7B (via litgpt/config.py); untied embeddings "
        "(Qwen2.5 report)",
    ),
    "Qwen/Qwen3-1.7B": (
        ModelShape(
            hidden=2048,
            layers=28,
            heads=16,
            kv_heads=8,
            head_dim=128,
            intermediate=6144,
            vocab=151936,
            max_positions=40960,
            tie_embeddings=True,
            qk_norm=True,
        ),
        "published config.json of Qwen/Qwen3-1.7B (via litgpt/config.py); tied embeddings (model card)",
    ),
}


def tiny_shape() -> ModelShape:
    """The built-in tiny model (aggbench.tiny.model) without building it: its config and tokenizer size."""
    from aggbench.tiny.model import CHARACTERS, MODEL_SHAPE, SPECIAL_TOKENS
    from aggbench.tiny.task import BOX

    vocab = len(SPECIAL_TOKENS) + len((BOX, *CHARACTERS))  # the tokenizer's vocabulary (tiny/model.py)
    return ModelShape.from_hf_config(
        {**MODEL_SHAPE, "vocab_size": vocab, "model_type": "llama"}, where="aggbench.tiny.model.MODEL_SHAPE"
    )
