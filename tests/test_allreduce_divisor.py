"""The all-reduce executor divides each gradient by the world size as a 0-dim float64 tensor (cached)
instead of the Python int: the same quotient, bit for bit, in every float dtype it sends."""

import pytest
import torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("world_size", [2, 3, 5, 6, 7, 8, 96])
def test_dividing_by_the_cached_divisor_is_dividing_by_the_int(dtype, world_size):
    g = torch.Generator().manual_seed(world_size)
    grad = (torch.randn(4096, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-6, 6, (4096,), generator=g)).to(dtype)
    by_int, by_tensor = torch.empty_like(grad), torch.empty_like(grad)
    torch.div(grad, world_size, out=by_int)
    torch.div(grad, torch.tensor(float(world_size), dtype=torch.float64), out=by_tensor)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    assert by_tensor.dtype == dtype
    assert torch.equal(by_int.view(bits), by_tensor.view(bits))  # bit patterns
