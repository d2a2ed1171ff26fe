"""The machine's roofline and where a workload's training sits under it.

Roofline (Williams, Waterman, Patterson 2009): a computation of arithmetic intensity
I = FLOPs / bytes moved cannot run faster than min(P, I·B), where P is the machine's peak FLOP/s
and B its memory bandwidth. Both are measured in the same run as the workload:

* P — the fp32 matrix-multiply peak (:func:`measures.matmul_peak`: the best median of
  ``torch.mm`` over n = 512, 1024, 2048);
* B — :func:`memory_bandwidth`: the best median over two streaming kernels on tensors of
  64 MiB each (far larger than the caches): ``copy`` (b.copy_(a): 1 read + 1 write per
  element) and ``add`` (torch.add(a, b, out=c): 2 reads + 1 write), bytes = elements × 4 ×
  (reads + writes) / seconds. Write-allocate traffic is not counted (as STREAM does not).

The workload's FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` (matrix
products and convolutions: what FLOP peaks are quoted for) and checked against
:func:`analytical_flops`. Its bytes are an *estimate* from :func:`bytes_model` — a documented
model of the traffic a step cannot avoid if no tensor stays in cache from one operation to the
next (see there). The model is not measured; caches reuse some of that traffic (the roofline
bound is then optimistic about bandwidth, pessimistic about the bound) and the framework moves
more (temporaries, padding, index gathers it does not list).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling modules (opacus ships a `benchmarks` package)

import torch  # noqa: E402
from measures import sync  # noqa: E402
from torch import nn  # noqa: E402

FLOAT_BYTES = 4


def memory_bandwidth(mib: int = 64, repeats: int = 7, device: str = "cpu") -> dict:
    """Measured streaming bandwidth (bytes/s) at torch's current thread count: best median of copy and add."""
    n = mib * 1024 * 1024 // FLOAT_BYTES
    a = torch.rand(n, device=device)
    b = torch.rand(n, device=device)
    c = torch.empty(n, device=device)
    kernels = {"copy": (lambda: b.copy_(a), 2), "add": (lambda: torch.add(a, b, out=c), 3)}
    per_kernel: dict[str, dict] = {}
    for name, (kernel, touches) in kernels.items():
        for _ in range(3):  # warm-up (page faults, first-use costs)
            kernel()
        samples = []
        for _ in range(repeats):
            sync(device)
            started = time.perf_counter()
            for _ in range(5):
                kernel()
            sync(device)
            samples.append((time.perf_counter() - started) / 5)
        moved = n * FLOAT_BYTES * touches
        per_kernel[name] = {"median_bytes_per_second": moved / statistics.median(samples),
                            "best_bytes_per_second": moved / min(samples), "bytes_per_call": moved}
    best = max(per_kernel, key=lambda k: per_kernel[k]["median_bytes_per_second"])
    return {"bandwidth": per_kernel[best]["median_bytes_per_second"],
            "bandwidth_gbs": per_kernel[best]["median_bytes_per_second"] / 1e9, "kernel": best,
            "kernels": per_kernel, "tensor_mib": mib, "repeats": repeats, "torch_threads": torch.get_num_threads(),
            "method": "median over repeats of 5 calls each; bytes = elements x 4 x (reads + writes); best kernel"}


def layer_shapes(model: nn.Module, input_shape: Sequence[int]) -> list[tuple[nn.Module, tuple[int, ...], tuple[int, ...]]]:
    """(leaf module, input shape, output shape) per example, in execution order (forward hooks)."""
    seen: list[tuple[nn.Module, tuple[int, ...], tuple[int, ...]]] = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append((m, tuple(i[0].shape[1:]), tuple(o.shape[1:]))))
             for m in model.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape))
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def analytical_flops(model: nn.Module, input_shape: Sequence[int]) -> dict:
    """Matrix-product and convolution FLOPs per example of one SGD step, from the layer shapes.

    Forward: a convolution costs 2·C_in·C_out·k_h·k_w·H_out·W_out (per group: C_in/groups), a
    linear layer 2·in·out. Backward: the weight gradient of every such layer costs its forward
    again, the input gradient too — except for the first layer, whose input (the data) needs no
    gradient and is not computed. So backward = 2× forward minus the first layer's forward.
    Biases, activations, the loss and the optimiser step are not matrix products: not counted
    (as FlopCounterMode does not count them).
    """
    forward = []
    for module, _, out in layer_shapes(model, input_shape):
        if isinstance(module, nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1]
            forward.append(2 * module.in_channels // module.groups * module.out_channels * k * out[1] * out[2])
        elif isinstance(module, nn.Linear):
            forward.append(2 * module.in_features * module.out_features)
    total_forward = sum(forward)
    backward = 2 * total_forward - (forward[0] if forward else 0)
    return {"forward_per_example": total_forward, "backward_per_example": backward,
            "per_example": total_forward + backward, "layers_forward": forward}


def _conv_backward_flop(grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed, output_padding,
                        groups, output_mask, out_shape, **kwargs) -> int:
    """torch's ``convolution_backward`` FLOP formula with the weight gradient of a *grouped*
    convolution divided by the number of groups.

    torch's formula (``torch.utils.flop_counter.conv_backward_flop``, torch 2.x) counts the
    weight gradient of a convolution with g groups as if it had one: g times its real cost (a
    grouped convolution of g = 3 groups of 12→12 channels counts 3× three separate 12→12
    convolutions; ``tests/benchmarks/test_roofline.py`` checks it). vmap runs the clients'
    convolutions as one grouped convolution with g = clients, so uncorrected, the batched
    engine's count of the CNN would be ≈ clients/2 times too large. The input gradient's count
    is right and kept.
    """
    from torch.utils.flop_counter import conv_backward_flop

    args = (grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed, output_padding, groups)
    flops = conv_backward_flop(*args, [output_mask[0], False, False], out_val=out_shape)  # torch's shape_wrapper
    if output_mask[1]:
        weight = conv_backward_flop(*args, [False, True, False], out_val=out_shape)
        flops += weight // max(1, int(groups))
    return flops


def flop_counter(**kwargs):
    """``FlopCounterMode`` with the grouped-convolution weight gradient counted right (:func:`_conv_backward_flop`),
    counting the model's own multiply-adds.

    On the CPU the batched engine pads each client's convolution channels to a multiple of 16
    (:mod:`defenses.blocks.grouped_network`): multiplications by zero that are not the model's
    work. While counting, the padding is off (``channel_block(1)``): the same grouped
    convolutions with the model's channel counts, so the count is the model's FLOPs and the
    achieved FLOP/s is useful work per second.
    """
    from torch.utils.flop_counter import FlopCounterMode

    from defenses.blocks.grouped_network import channel_block

    class ModelFlopCounter(FlopCounterMode):
        def __enter__(self):
            self._unpadded = channel_block(1)
            self._unpadded.__enter__()
            return super().__enter__()

        def __exit__(self, *exc):
            try:
                return super().__exit__(*exc)
            finally:
                self._unpadded.__exit__(None, None, None)

    return ModelFlopCounter(display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flop},
                            **kwargs)


def counted_step_flops(model: nn.Module, input_shape: Sequence[int], batch: int = 4) -> int:
    """FlopCounterMode's count of one forward + backward (parameter gradients) on ``batch`` examples, per example."""
    x = torch.rand(batch, *input_shape)
    y = torch.zeros(batch, dtype=torch.int64)
    params = [p for p in model.parameters()]
    counter = flop_counter()
    with counter:
        loss = nn.functional.cross_entropy(model(x), y)
        torch.autograd.grad(loss, params)
    return counter.get_total_flops() // batch


def bytes_model(model: nn.Module, input_shape: Sequence[int], batch_size: int, examples_per_step: float | None = None) -> dict:
    """Estimated bytes one example moves in one local SGD step (float32), under this model:

    * data: the batch gather reads and writes the input (2×), the forward pass reads it, the first
      layer's weight gradient reads it again: 4 × input elements;
    * every intermediate tensor (the output of each layer and each activation, per example) is
      written once and read once in the forward pass, read once more in the backward pass (it is
      saved for the gradient), and its gradient is written once and read once: 5 × elements;
    * parameters, per client and step (shared by the step's ``batch_size`` examples): read in the
      forward pass, read again for the input gradients, the gradient written, and the SGD update
      reads the parameters and the gradient and writes the parameters: 6 × parameters.

    No reuse through caches from one operation to the next is assumed, and nothing the framework
    adds (temporaries, padding, the engine's bookkeeping) is listed. ``examples_per_step``: the
    average real examples per client step (a smaller last batch spreads the parameter traffic
    over fewer examples); default ``batch_size``.
    """
    per_step = float(examples_per_step or batch_size)
    inputs = math.prod(input_shape)
    intermediate = sum(math.prod(out) for module, _, out in layer_shapes(model, input_shape)
                       if not isinstance(module, nn.Flatten))  # a view: no traffic
    parameters = sum(p.numel() for p in model.parameters())
    per_example_elements = 4 * inputs + 5 * intermediate + 6 * parameters / per_step
    return {"bytes_per_example": FLOAT_BYTES * per_example_elements, "input_elements": inputs,
            "intermediate_elements": intermediate, "parameters": parameters, "examples_per_client_step": per_step,
            "model": "4 x input + 5 x intermediate tensors per example + 6 x parameters per client step, "
                     "float32, no cache reuse between operations"}


def roofline_bound(intensity: float, peak_flops: float, bandwidth: float) -> dict:
    """min(P, I·B) and which side binds; the ridge point is P / B FLOP/byte."""
    memory = intensity * bandwidth
    return {"bound_flops": min(peak_flops, memory), "bound_by": "compute" if peak_flops <= memory else "memory",
            "ridge_intensity": peak_flops / bandwidth, "memory_bound_flops": memory}


# --------------------------------------------------------------------------- a workload under the roofline


def count_training_flops(workload, engine: str = "batched") -> dict:
    """FlopCounterMode's count (:func:`flop_counter`) of the workload's training with ``engine``: one
    round and the final evaluation.

    ``defense.train(job)`` is counted with 1 round and with 2 rounds; the difference is one
    round's training (every round trains all clients on the same batch shapes), what is left of
    the 1-round count is the evaluation at the end (test set + the members, forward only). The
    counter sees the operations vmap dispatches (the batched engine's ``bmm`` and grouped
    convolutions) and the backward of ``torch.autograd.grad``.
    """
    from workloads import dp_fedavg

    counts = []
    for rounds in (1, 2):
        counter = flop_counter()
        with counter:
            dp_fedavg().train(workload.job(rounds, engine))
        counts.append((int(counter.get_total_flops()),
                       {str(op): int(v) for op, v in counter.get_flop_counts().get("Global", {}).items()}))
    per_round = counts[1][0] - counts[0][0]
    by_op = {op: counts[1][1].get(op, 0) - counts[0][1].get(op, 0) for op in sorted(set(counts[0][1]) | set(counts[1][1]))}
    return {"per_round": per_round, "evaluation": counts[0][0] - per_round, "per_round_by_op": by_op}


def construction_flops(workload) -> int:
    """FLOPs counted while the workload's model is built (a factory may probe its shapes with a forward pass)."""
    counter = flop_counter()
    with counter:
        workload.model()
    return int(counter.get_total_flops())


def workload_roofline(workload, engine_result: dict, peak_flops: float, bandwidth: float,
                      engines: tuple[str, ...] = ("batched", "loop")) -> dict:
    """Each engine's achieved FLOP/s on ``workload`` as a fraction of the roofline bound min(P, I·B).

    FLOPs: counted (:func:`count_training_flops`), checked against :func:`analytical_flops` (a
    mismatch raises RuntimeError). Bytes: :func:`bytes_model` per example of a training step;
    I = FLOPs / bytes of a training step (the final evaluation, ≈ 5 % of the timed FLOPs, is
    counted in the achieved FLOPs but not in I). Achieved FLOP/s = counted FLOPs of the span
    ``engine_result`` timed (its ``rounds`` rounds and the final evaluation) / its median seconds.
    """
    model = workload.model()
    shape = tuple(workload.features.shape[1:])
    analytical = analytical_flops(model, shape)
    examples = sum(len(c) for c in workload.clients) * workload.local_epochs
    steps = workload.steps_per_client
    evaluation_examples = len(workload.test) + sum(len(c) for c in workload.clients)
    expected_round = examples * analytical["per_example"]
    expected_eval = evaluation_examples * analytical["forward_per_example"]
    traffic = bytes_model(model, shape, workload.batch_size, workload.records_per_client * workload.local_epochs / steps)
    intensity = analytical["per_example"] / traffic["bytes_per_example"]
    bound = roofline_bound(intensity, peak_flops, bandwidth)
    rounds = engine_result["rounds"]
    out: dict = {"workload": workload.name, "analytical": {**analytical, "per_round": expected_round,
                                                           "evaluation": expected_eval},
                 "bytes": traffic, "bytes_per_round": examples * traffic["bytes_per_example"],
                 "intensity_flops_per_byte": intensity, "peak_flops": peak_flops, "bandwidth": bandwidth, **bound,
                 "engines": {}}
    for engine in engines:
        if engine not in engine_result:
            continue
        counted = count_training_flops(workload, engine)
        # the model factory may run a forward pass itself (LeNet's sizes its linear layer so): a
        # training builds its model a fixed number of times, counted in the 1-round "evaluation"
        build = construction_flops(workload)
        extra = counted["evaluation"] - expected_eval
        builds = extra // build if build and extra >= 0 and extra % build == 0 else (0 if extra == 0 else None)
        counted["model_constructions"] = builds
        counted["evaluation"] -= (builds or 0) * build
        if counted["per_round"] != expected_round or counted["evaluation"] != expected_eval:
            raise RuntimeError(f"{workload.name}/{engine}: FlopCounterMode counted {counted['per_round']} per round and "
                               f"{counted['evaluation']} for the evaluation; analytical {expected_round}, {expected_eval}")
        seconds = engine_result[engine]["seconds"]
        flops = rounds * counted["per_round"] + counted["evaluation"]
        achieved = flops / seconds
        out["engines"][engine] = {**counted, "counted_equals_analytical": True, "timed_flops": flops,
                                  "seconds": seconds, "achieved_flops": achieved,
                                  "fraction_of_bound": achieved / bound["bound_flops"],
                                  "fraction_of_peak": achieved / peak_flops}
    return out
