"""`training.deepen`: a model deepened with identity blocks computes what it did, offline and
streamed (float64 1e-12), with or without a GLU; the old blocks keep their weights in order; the
new blocks learn from the first step; the command writes a training checkpoint with the input's
metadata and refuses a shallower target."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dlr_runtime import DLRModel, load_checkpoint, read_header, save_checkpoint
from dlr_runtime.recurrent import to_recurrent
from tests.dlr_runtime.test_frontend import audio, streamed
from tests.dlr_runtime.test_pcen import config
from training.deepen import deepen, new_positions
from training.deepen import main as deepen_main


def test_new_blocks_are_spread_between_the_old_ones():
    assert new_positions(4, 4) == []
    assert new_positions(4, 6) == [2, 5]  # after old blocks 2 and 4
    assert new_positions(4, 8) == [1, 3, 5, 7]  # after every old block
    assert new_positions(4, 5) == [4]
    assert new_positions(2, 7) == [0, 1, 3, 4, 6]  # two before block 1, two after, one last
    for old, new in [(1, 3), (3, 4), (4, 9), (6, 12)]:
        pos = new_positions(old, new)
        assert len(pos) == new - old and len(set(pos)) == len(pos)
        assert all(0 <= p < new for p in pos)
    with pytest.raises(ValueError, match="old <= new"):
        new_positions(4, 3)


@pytest.mark.parametrize("glu", [True, False])
def test_deepened_model_computes_what_it_did(glu):
    cfg = config(frontend="logmel", glu=glu, n_layers=2)
    shallow = DLRModel(cfg, seed=3).double().eval()
    deep = deepen(shallow, 5, seed=9).eval()
    assert deep.config == replace(cfg, n_layers=5)
    fresh = new_positions(2, 5)
    kept = [i for i in range(5) if i not in fresh]
    for i, j in zip(kept, range(2), strict=True):  # the old blocks, in order, unchanged
        for (name, a), b in zip(
            deep.blocks[i].state_dict().items(),
            shallow.blocks[j].state_dict().values(),
            strict=True,
        ):
            assert torch.equal(a, b), name
    for i in fresh:  # a new block's SSM is a fresh one, not a copy of an old block's
        new_ssm = deep.blocks[i].ssm.state_dict()
        for old in shallow.blocks:
            assert any(not torch.equal(v, old.ssm.state_dict()[k]) for k, v in new_ssm.items())
    x = audio(2, 40 * 60, seed=6)
    with torch.no_grad():
        want = shallow(x)
        assert float((deep(x) - want).abs().max()) < 1e-12
    rec = to_recurrent(deep, dtype=torch.complex128, max_block=16)
    out = streamed(rec, x, [5, 777, 1500], steps_from=2000)
    assert float((out - want).abs().max()) < 1e-12


def test_new_blocks_learn_from_the_first_step():
    shallow = DLRModel(config(frontend="logmel", n_layers=2), seed=1).double()
    deep = deepen(shallow, 3, seed=2)
    new = deep.blocks[new_positions(2, 3)[0]]
    deep(audio(2, 40 * 20, seed=1)).square().sum().backward()
    h = deep.config.d_model
    assert float(new.pw.out.weight.grad[:h].abs().sum()) > 0  # the zero rows move
    opt = torch.optim.SGD(deep.parameters(), lr=0.1)
    opt.step()
    opt.zero_grad()
    deep(audio(2, 40 * 20, seed=1)).square().sum().backward()
    ssm_grads = [p.grad for p in new.ssm.parameters() if p.grad is not None]
    assert ssm_grads and any(float(g.abs().sum()) > 0 for g in ssm_grads)  # then the SSM


def test_command_writes_a_training_checkpoint(tmp_path):
    shallow = DLRModel(config(frontend="logmel"), seed=4)
    save_checkpoint(shallow, tmp_path / "shallow", operating_point={"threshold": 0.8})
    args = [str(tmp_path / "shallow"), "--n-layers", "4", "--out", str(tmp_path / "deep")]
    assert deepen_main(args) == 0
    loaded = load_checkpoint(tmp_path / "deep")
    assert isinstance(loaded, DLRModel) and loaded.config.n_layers == 4
    meta = read_header(tmp_path / "deep")["metadata"]
    assert meta["operating_point"] == {"threshold": 0.8}
    assert meta["deepened_from"] == str(tmp_path / "shallow")
    x = audio(1, 40 * 30, seed=2, dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(loaded.eval()(x), shallow.eval()(x), atol=1e-5)
    with pytest.raises(SystemExit) as e:
        deepen_main([str(tmp_path / "deep"), "--n-layers", "2", "--out", str(tmp_path / "x")])
    assert e.value.code == 2
