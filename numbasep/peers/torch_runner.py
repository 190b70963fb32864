"""PyTorch peer: ``conv2d(groups=C)`` (channels_last memory for channels-last cases).

Run by :mod:`numbasep.peers.driver` in its own process (protocol in
``_harness.py``). Gradients call ``torch.ops.aten.convolution_backward`` with an
output mask, the kernel autograd's backward runs for a convolution, so only the
asked-for gradient is computed; the separable gradient runs autograd itself
(forward recomputed, as numbasep's ``separable_conv_grad`` does).

Channels-last 1-D cases run as 2-D with a size-1 row (PyTorch has no
channels-last memory format for 3-D tensors); 3-D cases use
``channels_last_3d``. SAME padding is given as a symmetric padding of
``max(before, after)`` when that yields the same output size (same cost, the
window shifted by at most one pixel); otherwise the input is padded explicitly
(the copy is then part of the time).
"""

import os
import sys

if __package__:                      # imported as numbasep.peers.<runner>
    from . import _harness
else:                                # run by path, possibly without numbasep installed
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _harness  # noqa: E402


def load(threads):
    import torch
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    return f"torch {torch.__version__}", torch


def _same_pads(case):
    """Symmetric torch padding per dim, or None when asymmetric padding is needed."""
    pads = []
    for n, k, o, (b, a) in zip(case["spatial"], case["kernel"], case["out_spatial"],
                               case["pads"]):
        p = max(b, a)
        if (n + 2 * p - k) // case["stride"] + 1 != o:
            return None
        pads.append(p)
    return pads


def build(torch, case, rng):
    import numpy as np
    F = torch.nn.functional
    nd = len(case["spatial"])
    cl = case["channels_last"]
    dt = getattr(torch, case["dtype"])
    C, M = case["C"], case["multiplier"]
    two_d = nd == 2 or (nd == 1 and cl)     # channels-last 1-D runs as 2-D
    tnd = 2 if two_d else nd
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[tnd]
    mf = {2: torch.channels_last, 3: torch.channels_last_3d}.get(tnd) if cl else None

    def act(shape_in_case_layout):
        """An activation tensor: logical NC*, memory in the case's layout."""
        a = _harness.random_array(rng, shape_in_case_layout)
        t = torch.from_numpy(a)
        if cl:
            t = t.movedim(-1, 1)           # (N, *S, C) -> logical (N, C, *S), channels-last memory
        if tnd != nd:
            t = t.unsqueeze(2)             # 1-D -> 2-D with a size-1 row
        t = t.to(dt)
        return t.contiguous(memory_format=mf) if mf is not None else t.contiguous()

    k = list(case["kernel"])
    w_np = _harness.random_array(rng, case["filter_shape"])          # (*K, C, M)
    w = torch.from_numpy(np.ascontiguousarray(
        np.moveaxis(w_np.reshape(*k, C * M), -1, 0)[:, None]))       # (C*M, 1, *K)
    if tnd != nd:
        w = w.unsqueeze(2)
    w = w.to(dt).contiguous()
    s = case["stride"]
    stride = ([1, s] if tnd != nd else [s] * nd)
    sym = _same_pads(case)
    explicit = None
    if sym is None:
        padding = [0] * tnd
        explicit = []
        for b, a in reversed(case["pads"]):
            explicit += [b, a]
    else:
        padding = ([0] + sym) if tnd != nd else sym
    dil = [1] * tnd
    zero = [0] * tnd

    def pad(x):
        return F.pad(x, explicit) if explicit else x

    x = act(case["input_shape"])
    op = case["op"]
    if op == "forward":
        def fn():
            with torch.no_grad():
                return conv(pad(x), w, None, stride, padding, 1, C)
    elif op in ("backprop_input", "backprop_filter"):
        if explicit:
            raise NotImplementedError("asymmetric SAME padding")
        dy = act(case["output_shape"])
        mask = [op == "backprop_input", op == "backprop_filter", False]

        def fn():
            return torch.ops.aten.convolution_backward(
                dy, x, w, None, stride, padding, dil, False, zero, C, mask)
    else:
        F_ = case["filters"]
        pk_np = _harness.random_array(rng, case["pointwise_shape"]).reshape(C * M, F_)
        pk = torch.from_numpy(np.ascontiguousarray(pk_np.T)).reshape(
            F_, C * M, *([1] * tnd)).to(dt).contiguous()

        def fwd(x, w, pk):
            return conv(conv(pad(x), w, None, stride, padding, 1, C), pk)
        if op == "separable_forward":
            def fn():
                with torch.no_grad():
                    return fwd(x, w, pk)
        else:
            dy = act(case["separable_output_shape"])
            xg, wg, pkg = (t.detach().requires_grad_(True) for t in (x, w, pk))

            def fn():
                y = fwd(xg, wg, pkg)
                return torch.autograd.grad(y, (xg, wg, pkg), grad_outputs=dy)
    fn()
    return fn


if __name__ == "__main__":
    sys.exit(_harness.main("torch", load, build))
