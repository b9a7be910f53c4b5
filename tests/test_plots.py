"""andrea.plots: pictures drawn with names that look like formulas, and written whole or not at all."""

import shutil

import pytest
from helpers import cli, documents, root_train_args

from andrea.errors import AndreaError
from andrea.plots import plot_curriculum, plot_map, plot_parameter_groups, pyplot, save_figure

PNG = b"\x89PNG\r\n\x1a\n"
FORMULAS = ["$\\frac$", "$x^$", "a $ b", "$\\alpha$"]


def test_labels_that_look_like_formulas_are_drawn_as_text(tmp_path):
    points = [{"x": float(i), "y": float(-i), "single": i % 2 == 0, "label": w} for i, w in enumerate(FORMULAS)]
    path = plot_map(points, None, tmp_path / "$\\frac$" / "map.png", "words $\\frac$ and $x^$")
    assert path.read_bytes()[:8] == PNG
    history = [{"step": s, "source": FORMULAS[s % 2], "reward": 0.1 * s,
                "weights": {FORMULAS[0]: 0.5, FORMULAS[1]: 0.5}} for s in range(1, 6)]
    plot_curriculum(history, tmp_path / "curriculum.png")
    assert (tmp_path / "curriculum.png").read_bytes()[:8] == PNG


def test_a_failed_write_leaves_the_old_picture_whole_and_says_so(tmp_path, monkeypatch):
    from andrea.inside.embed import ParamGroup

    groups = [ParamGroup("token embedding (wte)", "10 × 4", 40, 0.4, True),
              ParamGroup("embedding total", "", 40, 0.4, False), ParamGroup("total", "", 100, 1.0, False)]
    path = plot_parameter_groups(groups, tmp_path / "table.png", "tiny")
    before = path.read_bytes()
    plt = pyplot()
    fig = plt.figure()

    def half_then_full(target, **kwargs):
        with open(target, "wb") as f:
            f.write(PNG)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fig, "savefig", half_then_full)
    with pytest.raises(AndreaError, match=r"could not write .*table\.png \(No space left on device\); it is as it was"):
        save_figure(fig, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["table.png"]  # no temporary file left behind


def test_a_run_goes_on_when_its_pictures_cannot_be_written(data_dir, tmp_path, monkeypatch):
    """loss.png and curriculum.png are observers: a picture that cannot be written (here: no space
    left) is a note in the log, and the run trains to its last step."""
    from helpers import opts, tiny_config

    import andrea.files
    from andrea.train import train

    real = andrea.files.replace_durably

    def no_png(tmp, path):
        if str(path).endswith(".png"):
            raise OSError(28, "No space left on device")
        return real(tmp, path)

    monkeypatch.setattr(andrea.files, "replace_durably", no_png)
    lines = []
    result = train(tiny_config(data_dir), opts(max_steps=8, sampling="ucb"), data_dir, tmp_path / "r",
                   log=lines.append, progress=False)
    assert result.stopped == "max_steps" and result.step == 8
    notes = [line for line in lines if line.startswith("note: could not draw")]
    assert any("loss.png" in n for n in notes) and any("curriculum.png" in n for n in notes), lines
    assert not list((tmp_path / "r").glob("*.png"))


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_a_dollar_formula_in_a_source_name_is_drawn_as_written(prepared_root, tmp_path, capsys):
    """matplotlib reads `$...$` as mathtext; a source named `p$\\frac$q` (from its file name)
    must not end the run at its first evaluation, in loss.png or in curriculum.png."""
    odd = tmp_path / "p$\\frac$q.txt"
    shutil.copy(prepared_root / "text.txt", odd)
    (tmp_path / "other.txt").write_text("\n\n".join(documents(5, 60)))
    code, _, err = cli(capsys, "prepare", odd, tmp_path / "other.txt", "--tokenizer", prepared_root / "tok", "--out", tmp_path / "d",
                       "--no-progress")
    assert code == 0, err
    out = tmp_path / "r"
    code, stdout, err = cli(capsys, *root_train_args(prepared_root, out, data=tmp_path / "d"))
    assert code == 0 and "could not draw" not in stdout + err, err
    assert (out / "loss.png").stat().st_size > 0 and (out / "curriculum.png").stat().st_size > 0
