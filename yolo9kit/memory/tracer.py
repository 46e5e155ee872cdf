"""Trace one training step of the kit, on ``meta`` tensors or real ones: the storage tracker, the autocast
emulation and the bridge that runs the loss for real (docs/memory.md, "How `estimate` works")."""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map_only, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from yolo9kit.memory.gpus import round_size
from yolo9kit.train.step import AMP_DTYPES, train_step

# The categories of a MemoryReport breakdown, in display order.
CATEGORIES = ("weights", "gradients", "optimizer_state", "ema", "activations", "loss_assigner", "workspace_other")
# phase a storage was born in -> category, unless its identity says otherwise
_PHASE_CATEGORY = {"forward": "activations", "loss": "loss_assigner", "loss_backward": "loss_assigner"}


@dataclass
class StorageRecord:
    nbytes: int
    phase: str
    alloc: int  # event index
    free: int | None = None  # event index; None while alive
    tag: str | None = None  # identity category (weights, gradients, ...) when known


@dataclass
class Trace:
    """What a tracker saw: storages with alloc/free event indices, and where each phase starts."""

    records: list[StorageRecord]
    num_events: int
    phase_starts: list[tuple[str, int]] = field(default_factory=list)

    def category(self, rec: StorageRecord) -> str:
        return rec.tag or _PHASE_CATEGORY.get(rec.phase, "workspace_other")

    def live(self) -> np.ndarray:
        """(num_events, len(CATEGORIES)) live bytes per category after each event."""
        deltas = np.zeros((max(self.num_events, 1), len(CATEGORIES)), dtype=np.int64)
        for rec in self.records:
            k = CATEGORIES.index(self.category(rec))
            deltas[rec.alloc, k] += rec.nbytes
            if rec.free is not None:
                deltas[rec.free, k] -= rec.nbytes
        return np.cumsum(deltas, axis=0)

    def peak(self) -> dict[str, int]:
        """Live bytes per category at the moment most bytes are live."""
        live = self.live()
        return {c: int(v) for c, v in zip(CATEGORIES, live[int(live.sum(1).argmax())])}


class StorageTracker(TorchDispatchMode):
    """Each storage an op creates, once, and when it dies; sizes rounded as CUDA's for ``device_type`` "cuda"."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.records: list[StorageRecord] = []
        self._index: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> record index
        self._refs: list[weakref.ref] = []
        self.events = 0
        self.phase = "setup"
        self.phase_starts: list[tuple[str, int]] = [("setup", 0)]
        self.paused = False
        self.forward_flops = 0  # FLOPs of the convolutions in the "forward" phase (multiply-add = 2)
        self._param_storages: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.phase_starts.append((phase, self.events))

    def _record(self, storage: torch.UntypedStorage, tag: str | None) -> None:
        if (idx := self._index.get(storage)) is not None:
            self.records[idx].tag = self.records[idx].tag or tag
            return
        idx = len(self.records)
        nbytes = round_size(storage.nbytes()) if self.device_type == "cuda" else storage.nbytes()
        self.records.append(StorageRecord(nbytes, self.phase, self.events, tag=tag))
        self.events += 1
        self._index[storage] = idx
        self._refs.append(weakref.ref(storage, lambda _ref, i=idx: self._on_free(i)))

    def _on_free(self, idx: int) -> None:
        rec = self.records[idx]
        if rec.free is None:
            rec.free = self.events
            self.events += 1

    def register(self, tensors, tag: str) -> None:
        """Record tensors that exist already (parameters, EMA, optimizer state) under ``tag``."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                self._record(st, tag)
                if tag == "weights" and isinstance(t, torch.nn.Parameter):
                    self._param_storages[st] = True

    def tag(self, tensor: torch.Tensor, tag: str) -> None:
        """Give a recorded storage an identity category (e.g. it became a ``.grad``)."""
        if (idx := self._index.get(tensor.untyped_storage())) is not None:
            self.records[idx].tag = tag

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        if func is torch.ops.aten.convolution.default and self.phase == "forward":
            w = args[1]
            self.forward_flops += 2 * out.numel() * w.shape[1] * w.shape[2] * w.shape[3]
        tag = "weights" if func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.Tensor) \
            and args[0].untyped_storage() in self._param_storages else None  # autocast's cast of a weight
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._record(t.untyped_storage(), tag)
        return out

    def trace(self) -> Trace:
        """A snapshot: storages freed after this call count as alive to the end."""
        return Trace([replace(r) for r in self.records], self.events, list(self.phase_starts))


# The op lists of the PyTorch AMP documentation: CUDA ops that autocast to float16 / to float32, ...
LOWER_PRECISION = frozenset("""conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d
    convolution _convolution prelu addmm addmv addr matmul __matmul__ __rmatmul__ einsum mm mv linear addbmm baddbmm bmm
    chain_matmul multi_dot scaled_dot_product_attention lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell""".split())
FLOAT32 = frozenset("""__pow__ __rdiv__ __rpow__ __rtruediv__ acos asin binary_cross_entropy_with_logits cosh
    cosine_embedding_loss cdist cosine_similarity cross_entropy dist erfinv exp expm1 group_norm hinge_embedding_loss
    kl_div l1_loss layer_norm log log10 log1p log2 margin_ranking_loss mse_loss multilabel_margin_loss multi_margin_loss
    nll_loss norm normalize pdist poisson_nll_loss pow reciprocal rsqrt sinh smooth_l1_loss soft_margin_loss softmin
    softplus renorm tan triplet_margin_loss""".split())
# reductions called with ``dtype=torch.float32`` (no fp32 copy of their input)
FLOAT32_BY_DTYPE_ARG = frozenset({"sum", "softmax", "log_softmax", "cumsum", "cumprod", "prod"})
PROMOTE = frozenset({"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put",
                     "scatter_add", "tensordot", "cat", "stack", "index_copy"})
# ... and the CPU ones (bf16), by their Python names (``cross_entropy`` calls ``cross_entropy_loss``)
CPU_LOWER_PRECISION = frozenset("""conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm addbmm linear _convolution
    matmul __matmul__ __rmatmul__ conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d prelu
    scaled_dot_product_attention""".split())
CPU_FLOAT32 = frozenset("""avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft cdist trace
    view_as_complex cholesky cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d
    max_unpool2d max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d
    replication_pad3d mse_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss poisson_nll_loss
    cross_entropy cross_entropy_loss smooth_l1_loss huber_loss margin_ranking_loss soft_margin_loss triplet_margin_loss
    multi_margin_loss ctc_loss kl_div multilabel_margin_loss binary_cross_entropy_with_logits""".split())
POLICIES = {"cuda": (LOWER_PRECISION, FLOAT32, FLOAT32_BY_DTYPE_ARG, PROMOTE),
            "cpu": (CPU_LOWER_PRECISION, CPU_FLOAT32, frozenset(), frozenset({"cat", "stack", "index_copy"}))}


class AutocastEmulation(TorchFunctionMode):
    """The autocast policy of ``policy`` ("cuda", or "cpu" for a CPU bf16 step) with ``dtype`` (fp16 or bf16),
    applied on any device while ``enabled`` (real autocast reaches no ``meta`` tensor)."""

    def __init__(self, dtype: torch.dtype | None, policy: str = "cuda") -> None:
        super().__init__()
        self.dtype, self.enabled, self.caching = dtype, False, True
        self.lower, self.float32, self.by_dtype, self.promote = POLICIES[policy]
        self._weight_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def set_enabled(self, enabled: bool, caching: bool = True) -> None:
        self.enabled = bool(enabled) and self.dtype is not None
        self.caching = caching
        if not self.enabled or not caching:
            self._weight_cache.clear()  # autocast empties its cast cache when the region ends

    def _cast(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if not t.is_floating_point() or t.dtype == dtype or t.dtype == torch.float64:
            return t
        if not (t.is_leaf and t.requires_grad and self.caching):
            return t.to(dtype)
        hit = self._weight_cache.get(id(t))  # a weight: cast once per region, as CUDA autocast
        if hit is None or hit[0] is not t:
            hit = self._weight_cache[id(t)] = (t, t.to(dtype))
        return hit[1]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.enabled:
            return func(*args, **kwargs)
        if func is torch.Tensor.backward:
            return self._backward(args[0])
        name = getattr(func, "__name__", "")
        if name in self.lower:
            args, kwargs = tree_map_only(torch.Tensor, lambda t: self._cast(t, self.dtype), (args, kwargs))
        elif name in self.by_dtype:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None and first.dtype in (torch.float16, torch.bfloat16) and kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        elif name in self.float32:
            args = tree_map_only(torch.Tensor, lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t,
                                 args)
        elif name in self.promote:
            floats = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if floats and len({t.dtype for t in floats}) > 1:
                widest = torch.float32 if any(t.dtype == torch.float32 for t in floats) else floats[0].dtype
                args = tree_map_only(torch.Tensor, lambda t: t.to(widest) if t.is_floating_point() else t, args)
        return func(*args, **kwargs)

    def _backward(self, loss: torch.Tensor) -> None:
        # Checkpointed layers recompute under the forward's autocast state, each recompute its own region (no
        # weight cache). A function mode is off while it handles a call: entered again around the autograd engine.
        self.set_enabled(True, caching=False)
        with self:
            torch.autograd.Variable._execution_engine.run_backward(
                (loss,), (torch.ones_like(loss),), False, False, (), allow_unreachable=True, accumulate_grad=True)
        self.set_enabled(False)


class _LossBridge(torch.autograd.Function):
    """The loss of meta outputs, run for real on random CPU stand-ins under the same tracker (docs/memory.md)."""

    @staticmethod
    def forward(ctx, setup: tuple, *outputs: torch.Tensor):
        loss_fn, targets, ctx.tracker, spec, positions = setup
        ctx.meta = [(o.shape, o.dtype) for o in outputs]
        ctx.tracker.paused = True  # the stand-ins for the outputs are counted as activations already
        g = torch.Generator().manual_seed(0)
        ctx.real = [torch.randn(o.shape, generator=g).to(o.dtype).requires_grad_(True) for o in outputs]
        ctx.tracker.paused = False
        real = dict(zip(positions, ctx.real))
        with torch.enable_grad():
            ctx.loss, _ = loss_fn(tree_unflatten([real.get(i) for i in range(spec.num_leaves)], spec), targets)
        return outputs[0].new_zeros((), dtype=torch.float32), outputs[0].new_zeros(3, dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad_loss, grad_items):
        ctx.tracker.set_phase("loss_backward")
        torch.autograd.grad(ctx.loss, ctx.real, allow_unused=True)  # dropped: freed before the meta gradients exist
        ctx.loss = ctx.real = None
        ctx.tracker.set_phase("backward")
        return (None, *[grad_loss.new_empty(shape, dtype=dtype) for shape, dtype in ctx.meta])


def synthetic_batch(batch_size: int, imgsz: int, num_targets: int, num_classes: int, *, seed: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (B, 3, imgsz, imgsz) and ``num_targets`` boxes per image as targets (N, 6) ``[image_index,
    class, cx, cy, w, h]`` normalised, reproducible from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch_size, 3, imgsz, imgsz), dtype=torch.uint8, generator=g)
    n = batch_size * num_targets
    index = torch.arange(batch_size, dtype=torch.float32).repeat_interleave(num_targets)
    cls = torch.randint(0, num_classes, (n,), generator=g).float()
    wh = 0.05 + 0.3 * torch.rand(n, 2, generator=g)
    cxcy = wh / 2 + (1 - wh) * torch.rand(n, 2, generator=g)
    return images, torch.cat([index[:, None], cls[:, None], cxcy, wh], 1)


class _BackwardDone(Exception):
    """Ends a trace without the optimizer where the step would unscale the gradients."""


class _MarkingScaler:
    """The trainer's GradScaler: ``scale`` starts the backward, ``unscale_`` the optimizer (or ends the trace)."""

    def __init__(self, trainer, tracker: StorageTracker, optimizer: bool) -> None:
        self.scaler, self.tracker, self.optimizer = trainer.scaler, tracker, optimizer
        self.update = trainer.scaler.update
        self.meta, self.fused = trainer.device.type == "meta", bool(trainer.step.fused_optimizer)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        self.tracker.set_phase("backward")
        return self.scaler.scale(loss)

    def unscale_(self, optimizer) -> None:
        self.tracker.set_phase("optimizer" if self.optimizer else "end")
        if not self.optimizer:
            raise _BackwardDone
        self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        if not self.meta:
            self.scaler.step(optimizer)
        elif not self.fused:  # on meta: as for finite gradients (unreadable); a fused step allocates nothing
            optimizer.step()


def traced_step(trainer, images: torch.Tensor, targets: torch.Tensor, tracker: StorageTracker,
                emulation: AutocastEmulation | None = None, *, optimizer: bool = True) -> Trace:
    """The kit's own ``train_step`` (ni 0, a fresh window) under ``tracker`` -> its trace; the state that exists
    before it recorded first, the phases marked from outside the step (docs/memory.md)."""
    model, ema, scaler, loss_fn = trainer.model, trainer.ema, trainer.scaler, trainer.loss_fn
    tracker.register([*model.parameters(), *model.buffers()], "weights")
    if ema is not None:
        tracker.register([*ema.ema.parameters(), *ema.ema.buffers()], "ema")
    tracker.register([t for s in trainer.optimizer.state.values() for t in s.values()], "optimizer_state")

    def marked_loss(outputs, targets):
        tracker.set_phase("loss")
        return loss_fn(outputs, targets)

    hooks = [p.register_post_accumulate_grad_hook(lambda p: tracker.tag(p.grad, "gradients"))
             for p in model.parameters() if p.requires_grad]
    trainer.scaler = _MarkingScaler(trainer, tracker, optimizer)
    trainer.loss_fn, trainer.last_opt_step = marked_loss, -1
    with emulation or contextlib.nullcontext(), tracker:
        if emulation is not None:
            emulation.set_enabled(True)  # until backward ends (AutocastEmulation._backward)
        tracker.set_phase("forward")
        with contextlib.suppress(_BackwardDone):
            train_step(trainer, images, targets, ni=0, accumulate_steps=1)
        tracker.set_phase("end")
        trainer.optimizer.zero_grad(set_to_none=True)
    trainer.scaler, trainer.loss_fn = scaler, loss_fn
    for hook in hooks:
        hook.remove()
    return tracker.trace()


def trace_meta_step(trainer, loss_fn, batch_size: int, num_classes: int, *, optimizer: bool = True
                    ) -> tuple[Trace, float]:
    """One steady-state step of the meta trainer at ``batch_size`` and the step's largest image size, its autocast
    emulated -> (trace, forward GFLOPs per image). ``optimizer=False`` stops after backward."""
    step, tracker = trainer.step, StorageTracker(device_type="cuda")
    _, targets = synthetic_batch(batch_size, 32, step.num_targets, num_classes)
    images = torch.empty((batch_size, 3, step.peak_imgsz, step.peak_imgsz), dtype=torch.uint8, device="meta")

    def bridged_loss(outputs, _targets):  # the tracer's own trainer: the loss runs for real (``_LossBridge``)
        leaves, spec = tree_flatten(outputs)
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        return _LossBridge.apply((loss_fn, targets, tracker, spec, positions), *[leaves[i] for i in positions])

    trainer.loss_fn = bridged_loss
    emulation = AutocastEmulation(AMP_DTYPES[step.amp], "cpu" if step.device_type == "cpu" else "cuda")
    trace = traced_step(trainer, images, targets, tracker, emulation, optimizer=optimizer)
    return trace, tracker.forward_flops / 1e9 / batch_size


def trace_real_step(trainer, images: torch.Tensor, targets: torch.Tensor, device_type: str) -> Trace:
    """The same step on real tensors (CPU or CUDA, real autocast) under the same tracker."""
    return traced_step(trainer, images, targets, StorageTracker(device_type))
