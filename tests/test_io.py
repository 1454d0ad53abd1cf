"""Atomic writes: all or nothing, and outputs readable as a plain write would leave them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fastslow.io import atomic_path, umask, write_json


@pytest.fixture(params=[0o022, 0o027])
def mask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_umask_is_read_without_changing_it(mask):
    assert umask() == mask
    assert umask() == mask


def test_atomic_outputs_get_the_modes_of_a_plain_write(tmp_path, mask):
    """A directory output (model, final weights) gets mkdir's mode, not mkdtemp's 0700, and a
    file output open()'s: collaborators on a shared file system can read both."""
    with atomic_path(tmp_path / "model", is_dir=True) as tmp:
        (tmp / "config.json").write_text("{}")
    write_json({"a": 1}, tmp_path / "x.json")
    (tmp_path / "plain_dir").mkdir()
    (tmp_path / "plain.json").write_text("{}")
    assert _mode(tmp_path / "model") == _mode(tmp_path / "plain_dir") == 0o777 & ~mask
    assert _mode(tmp_path / "x.json") == _mode(tmp_path / "plain.json") == 0o666 & ~mask
    assert _mode(tmp_path / "model" / "config.json") == 0o666 & ~mask


def test_a_failed_write_leaves_the_old_output_and_no_temporary(tmp_path):
    write_json({"v": 1}, tmp_path / "x.json")
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "x.json") as tmp:
        tmp.write_text('{"v": ')
        raise RuntimeError("killed")
    assert (tmp_path / "x.json").read_text().replace(" ", "").replace("\n", "") == '{"v":1}'
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "d", is_dir=True) as tmp:
        (tmp / "part").write_text("half")
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_figures_are_saved_whole_and_alone(tmp_path):
    """_save writes the PDF and the PNG through temporaries: both exist, nothing else is left."""
    from fastslow.figures import _plt, _save

    fig = _plt().figure()
    fig.gca().plot([0, 1], [1, 0])
    _save(fig, tmp_path / "figs" / "fig.pdf")
    files = sorted((tmp_path / "figs").iterdir())
    assert [p.name for p in files] == ["fig.pdf", "fig.png"]
    assert files[0].read_bytes()[:4] == b"%PDF" and files[1].read_bytes()[:4] == b"\x89PNG"
