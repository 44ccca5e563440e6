"""The compressors of the 1-bit and top-k hooks, without communication."""

from __future__ import annotations

import pytest
import torch

from trainhub.runtime.distributed.onebit import (
    _pack_numpy,
    _pack_torch,
    _unpack_numpy,
    _unpack_torch,
    compress,
    decompress,
    pack_signs,
    unpack_signs,
)
from trainhub.runtime.distributed.topk import TopKState, num_selected, select_topk


@pytest.mark.parametrize("numel", [1, 7, 8, 9, 1000, 12345])
def test_sign_packing_round_trips_on_both_code_paths(numel: int) -> None:
    x = torch.randn(numel)
    positive = x >= 0
    assert torch.equal(_pack_numpy(positive), _pack_torch(positive))  # GPU path == CPU path
    packed = pack_signs(x)
    assert packed.dtype == torch.uint8
    assert packed.numel() == -(-numel // 8)  # 8 signs per byte
    assert torch.equal(_unpack_numpy(packed, numel), positive)
    assert torch.equal(_unpack_torch(packed, numel), positive)
    assert torch.equal(unpack_signs(packed, numel), positive)


def test_onebit_message_decodes_to_per_tensor_scaled_signs() -> None:
    torch.manual_seed(0)
    lengths = [6, 1, 17]
    x = torch.cat([torch.randn(6) * 10, torch.tensor([-0.5]), torch.randn(17) * 0.1])
    message, residual = compress(x, lengths)
    assert message.numel() == 4 * len(lengths) + -(-sum(lengths) // 8)
    decoded = decompress(message, lengths)
    expected = torch.cat(
        [torch.where(p >= 0, 1.0, -1.0) * p.abs().mean() for p in x.split(lengths)]
    )
    torch.testing.assert_close(decoded, expected)
    torch.testing.assert_close(residual + decoded, x, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("numel", "k"), [(50, 5), (300_000, 3_000), (300_000, 20)])
def test_select_topk_is_exact(numel: int, k: int) -> None:
    torch.manual_seed(1)
    x = torch.randn(numel)
    indices, values = select_topk(x, k, torch.Generator().manual_seed(0))
    _, expected = torch.topk(x.abs(), k)
    assert indices.dtype == torch.int32
    assert set(indices.tolist()) == set(expected.tolist())
    assert torch.equal(values, x[indices.long()])


def test_select_topk_is_exact_when_the_sample_sees_few_large_entries() -> None:
    x = torch.zeros(200_000)
    x[:10] = 5.0  # the sample hardly sees these; its threshold (0) passes everything
    x[10:3010] = torch.linspace(0.1, 1.0, 3000)
    indices, _ = select_topk(x, 2000, torch.Generator().manual_seed(0))
    assert set(range(10)) <= set(indices.tolist())
    assert x[indices.long()].abs().min() >= torch.topk(x.abs(), 2000).values.min()


def test_density_warmup_is_geometric() -> None:
    state = TopKState.__new__(TopKState)  # no process group needed for the schedule
    state.density, state.warmup_steps, state.start_step = 0.001, 100, 1
    for step, expected in [(0, 1.0), (1, 1.0), (51, 0.001**0.5), (101, 0.001), (500, 0.001)]:
        state.step = step
        assert state.current_density() == pytest.approx(expected)
    assert num_selected(1000, 0.001) == 1
    assert num_selected(10, 1e-9) == 1


def test_onebit_blocks_are_segments_of_each_tensor() -> None:
    from trainhub.runtime.distributed.onebit import num_scales, split_blocks

    torch.manual_seed(2)
    lengths = [1000, 7, 300]
    x = torch.randn(sum(lengths)) * torch.rand(sum(lengths))
    by_block, residual = compress(x, lengths, 256)
    by_segment, same_residual = compress(x, split_blocks(lengths, 256))
    assert num_scales(lengths, 256) == len(split_blocks(lengths, 256)) == 4 + 1 + 2
    assert torch.equal(by_block, by_segment)
    torch.testing.assert_close(residual, same_residual)
    torch.testing.assert_close(decompress(by_block, lengths, 256) + residual, x, rtol=0, atol=1e-6)
