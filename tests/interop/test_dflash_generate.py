"""z-lab's ``dflash_generate`` decoding our exported backbone: target greedy tokens, our per-round acceptance."""

from __future__ import annotations

import pytest
import torch
from dflash.model import DFlashDraftModel

from lit_domino.decoding import generate
from lit_domino.interop import export_drafter
from lit_domino.decoding.dflash_peer import cuda_sync_noop_on_cpu, dflash_official, to_dflash_model
from lit_domino.models import build_drafter, drafter_config
from lit_domino.testing import hf_greedy
from tests.interop.conftest import fit

B, N, T = 8, 30, 12


@pytest.fixture(scope="module")
def trained(target, one_thread):
    """A backbone fitted briefly on two target-greedy sequences: it accepts some drafts, not all."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 127, (T,), generator=g).tolist() for _ in range(3)]
    refs = [hf_greedy(target, p, N) for p in prompts]
    drafter = build_drafter(drafter_config("backbone", target, block_size=B), target)
    fit(drafter, target, [p + r for p, r in zip(prompts[:2], refs[:2])], steps=40)
    return drafter, prompts, refs


def full_rounds(res, start: int, max_length: int) -> list[int]:
    """Acceptance of the rounds in which dflash_generate verifies a full block (start + B <= max_length)."""
    out = []
    for acc in res.accepted_per_round:
        if start + B > max_length:
            break
        out.append(acc)
        start += acc + 1
    return out


def test_dflash_generate_reproduces_greedy_and_our_acceptance(tmp_path, target, trained, one_thread):
    drafter, prompts, refs = trained
    exported = DFlashDraftModel.from_pretrained(export_drafter(drafter, tmp_path / "bb", format="dflash")).eval()
    in_memory = to_dflash_model(drafter)
    seen = []
    for prompt, ref in zip(prompts, refs):
        ids = torch.tensor([prompt])
        ours = generate(target, drafter, ids, max_new_tokens=N)
        theirs = dflash_official(target, exported, ids, max_new_tokens=N)
        assert ours.tokens == ref and theirs.tokens == ref
        assert dflash_official(target, in_memory, ids, max_new_tokens=N).accepted_per_round == \
            theirs.accepted_per_round
        mine, official = full_rounds(ours, T, T + N), full_rounds(theirs, T, T + N)
        assert len(mine) >= 3 and mine == official
        seen += mine
        assert theirs.tpot_ms > 0 and theirs.prefill_time_s > 0
    assert 0 < sum(seen) < len(seen) * (B - 1)  # some drafts accepted, some rejected: a real comparison


def test_cuda_sync_patch_is_scoped():
    original = torch.cuda.synchronize
    with cuda_sync_noop_on_cpu(torch.device("cpu")):
        assert torch.cuda.synchronize is not original
        torch.cuda.synchronize()  # would raise without CUDA
    assert torch.cuda.synchronize is original


def test_only_a_backbone_runs_in_dflash_generate(domino):
    with pytest.raises(ValueError, match="decodes a DFlash backbone, not a 'domino' drafter"):
        to_dflash_model(domino)
