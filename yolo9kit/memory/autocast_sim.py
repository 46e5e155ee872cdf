"""Autocast, emulated on any device, so a trace on ``meta`` tensors allocates what an AMP step allocates.

``torch.autocast("cuda")`` is disabled on a machine without CUDA and does not reach ``meta`` tensors, so the
estimator applies the autocast policy itself, as a ``TorchFunctionMode`` (which sits above autograd, like
the real autocast dispatch key, so the casts are part of the autograd graph and the low-precision copies are
what backward saves). The lists are those of the PyTorch AMP documentation: for a CUDA step "CUDA Ops that
can autocast to float16" and "CUDA Ops that can autocast to float32"; for a CPU bf16 step (``policy="cpu"``)
"CPU Ops that can autocast to bfloat16" and "CPU Ops that can autocast to float32", which leave exp, log,
pow, sum, softmax and most of the loss in bf16 (``tests/test_memory_extras.py`` checks both policies against
the real CPU autocast where it runs). Ops on no list run in the dtype of their inputs (BatchNorm, SiLU,
pooling, upsampling, cat of equal dtypes).

Assumptions, stated once:

* Lower-precision ops (convolutions, matmul, linear, ...) cast floating inputs to fp16/bf16. Casts of
  leaf tensors that require grad (the weights) are cached for the whole autocast region, as CUDA
  autocast does, so each weight is copied once per forward.
* Activation checkpointing recomputes its layers in backward under the autocast state of the forward
  pass (``torch.utils.checkpoint`` re-enters autocast, and checks that the recomputed tensors have
  the dtypes of the first pass). So the emulation stays on through backward, without the weight cache
  (each recompute is its own autocast region); backward formulas run in C++ and never reach a
  function mode, so only recomputed forward code is affected. The emulation handles the step's
  ``Tensor.backward`` call itself (``_backward``): it starts backward through the autograd engine with the
  mode entered again, because a function mode is switched off while it handles a call.
* float32 ops (exp, log, pow, softmax, sum, BCE-with-logits, ...) compute in fp32. Reductions with a
  ``dtype`` argument (sum, softmax, log_softmax, cumsum, cumprod, prod) are called with
  ``dtype=torch.float32`` (no fp32 copy of the input); the others get fp32 copies of their inputs.
* "Promote" ops (cat, stack, addcmul, index_put, ...) cast all floating inputs to the widest dtype.
* BatchNorm keeps fp32 weights and running statistics, takes and returns the activation dtype; its
  saved mean/inverse std are fp32 (cuDNN and the meta kernel agree).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

LOWER_PRECISION = frozenset({
    "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution", "prelu", "addmm", "addmv", "addr", "matmul", "__matmul__", "__rmatmul__",
    "einsum", "mm", "mv", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "multi_dot",
    "scaled_dot_product_attention", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
})
FLOAT32 = frozenset({
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits", "cosh",
    "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "dist", "erfinv", "exp", "expm1",
    "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss", "layer_norm", "log", "log10", "log1p", "log2",
    "margin_ranking_loss", "mse_loss", "multilabel_margin_loss", "multi_margin_loss", "nll_loss", "norm",
    "normalize", "pdist", "poisson_nll_loss", "pow", "reciprocal", "rsqrt", "sinh", "smooth_l1_loss",
    "soft_margin_loss", "softmin", "softplus", "renorm", "tan", "triplet_margin_loss",
})
FLOAT32_BY_DTYPE_ARG = frozenset({"sum", "softmax", "log_softmax", "cumsum", "cumprod", "prod"})
PROMOTE = frozenset({"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put",
                     "scatter_add", "tensordot", "cat", "stack", "index_copy"})
# The CPU policy (bf16): fewer lower-precision ops, a float32 list without the pointwise maths and reductions,
# and no reduction called with a dtype (the Python-level names of the documented ops: ``cross_entropy`` is
# the function that calls ``cross_entropy_loss``).
CPU_LOWER_PRECISION = frozenset({
    "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm", "addbmm", "linear",
    "_convolution", "matmul", "__matmul__", "__rmatmul__", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "prelu", "scaled_dot_product_attention",
})
CPU_FLOAT32 = frozenset({
    "avg_pool3d", "binary_cross_entropy", "grid_sampler", "polar", "prod", "quantile", "nanquantile", "stft",
    "cdist", "trace", "view_as_complex", "cholesky", "cholesky_inverse", "cholesky_solve", "inverse", "lu_solve",
    "orgqr", "ormqr", "pinverse", "max_pool3d", "max_unpool2d", "max_unpool3d", "adaptive_avg_pool3d",
    "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d", "replication_pad3d",
    "mse_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "poisson_nll_loss",
    "cross_entropy", "cross_entropy_loss", "smooth_l1_loss", "huber_loss", "margin_ranking_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "ctc_loss", "kl_div",
    "multilabel_margin_loss", "binary_cross_entropy_with_logits",
})
POLICIES = {"cuda": (LOWER_PRECISION, FLOAT32, FLOAT32_BY_DTYPE_ARG, PROMOTE),
            "cpu": (CPU_LOWER_PRECISION, CPU_FLOAT32, frozenset(), frozenset({"cat", "stack", "index_copy"}))}


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    return obj


class AutocastEmulation(TorchFunctionMode):
    """Apply the autocast policy of ``policy`` ("cuda", or "cpu" for a CPU bf16 step) with ``dtype`` (fp16 or
    bf16) while ``enabled``.

    ``enabled`` is a plain attribute so a training step can switch the region on for forward + loss
    and off for backward and the optimizer, as ``with torch.autocast(...)`` does around the same code.
    """

    def __init__(self, dtype: torch.dtype | None, policy: str = "cuda") -> None:
        super().__init__()
        self.dtype = dtype
        self.lower, self.float32, self.by_dtype, self.promote = POLICIES[policy]
        self.enabled = False
        self.caching = True
        self._weight_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def set_enabled(self, enabled: bool, caching: bool = True) -> None:
        self.enabled = bool(enabled) and self.dtype is not None
        self.caching = caching
        if not self.enabled or not caching:
            self._weight_cache.clear()  # autocast empties its cast cache when the region ends

    def clear_cache(self) -> None:
        """End of the forward region: drop the cached weight casts (those saved for backward live on)."""
        self._weight_cache.clear()

    def _cast(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if not t.is_floating_point() or t.dtype == dtype or t.dtype == torch.float64:
            return t
        if t.is_leaf and t.requires_grad and self.caching:
            hit = self._weight_cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
            cast = t.to(dtype)
            self._weight_cache[id(t)] = (t, cast)
            return cast
        return t.to(dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.enabled:
            return func(*args, **kwargs)
        if func is torch.Tensor.backward:
            return self._backward(args[0])
        name = getattr(func, "__name__", "")
        low = self.dtype
        if name in self.lower:
            args, kwargs = _map_tensors(args, lambda t: self._cast(t, low)), {
                k: _map_tensors(v, lambda t: self._cast(t, low)) for k, v in kwargs.items()}
        elif name in self.by_dtype:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None and first.dtype in (torch.float16, torch.bfloat16) and kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        elif name in self.float32:
            args = _map_tensors(args, lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t)
        elif name in self.promote:
            floats = [t for t in _flat(args) if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if floats and len({t.dtype for t in floats}) > 1:
                widest = torch.float32 if any(t.dtype == torch.float32 for t in floats) else floats[0].dtype
                args = _map_tensors(args, lambda t: t.to(widest) if t.is_floating_point() else t)
        return func(*args, **kwargs)


    def _backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` in the step: checkpointed layers recompute under the forward's autocast state,
        without the weight cache (each recompute is its own autocast region); the region ends with it. A
        function mode is switched off while it handles a call, so it is entered again around the autograd
        engine for the recomputed forward code."""
        self.set_enabled(True, caching=False)
        with self:
            _engine_backward(loss)
        self.set_enabled(False)


def _engine_backward(loss: torch.Tensor) -> None:
    """``loss.backward()`` through the autograd engine itself, so that an active function mode (the
    autocast emulation) stays active while checkpointed layers recompute. Private PyTorch entry point,
    the one ``torch.autograd.backward`` ends in; plain ``backward()`` when it is missing."""
    engine = getattr(torch.autograd.Variable, "_execution_engine", None)
    if engine is None:
        loss.backward()
        return
    engine.run_backward((loss,), (torch.ones_like(loss),), False, False, (), allow_unreachable=True,
                        accumulate_grad=True)


def _flat(obj):
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _flat(o)
    else:
        yield obj
