"""tfdist-advise on any script: one whose main code runs on import is refused before anything
is probed, naming ``if __name__ == "__main__":``; a guarded one is imported without its main code
and without the advisor's arguments."""

from __future__ import annotations

import textwrap
import time

import pytest

from tfdist.advise import cli
from tfdist.advise.script_check import main_code
from tfdist.errors import AdviseError

UNGUARDED = textwrap.dedent("""
    import argparse
    import keras

    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    def build_model():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])

    model = build_model()
    model.compile("sgd", "mse")
    model.fit([[0.0] * 4], [[0.0] * 2], epochs=args.epochs)
""")

GUARDED = textwrap.dedent("""
    import argparse
    import sys

    KEPT_ARGV = list(sys.argv)

    def build_model(width=3):
        import keras
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(width)])

    if __name__ == "__main__":
        args = argparse.ArgumentParser().parse_args()
        raise SystemExit("main code ran on import")
""")


def test_main_code_names_the_statements_that_would_run_on_import():
    found = main_code(UNGUARDED)
    assert [line for _, line in found] == [
        "args = parser.parse_args()", "model = build_model()",
        "model.fit([[0.0] * 4], [[0.0] * 2], epochs=args.epochs)"]
    assert main_code(GUARDED) == []
    assert main_code("try:\n    import horovod\nexcept ImportError:\n    horovod = None\n") == []
    assert main_code("for i in range(3):\n    pass\n") == [(1, "for i in range(3):")]
    assert main_code("import keras\nkeras.utils.set_random_seed(1)\n") == []


def test_a_script_that_runs_on_import_is_refused_before_probing(tmp_path, capsys, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)

    def no_probe(*args, **kwargs):
        raise AssertionError("the network was probed before the script was checked")

    monkeypatch.setattr(cli, "get_constants", no_probe)
    started = time.perf_counter()
    assert cli.main([f"{script}:build_model", "--cluster", "2"]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - started < 5.0
    assert f"{script} runs its main code when imported" in err
    assert "Received: line 7: args = parser.parse_args(); line 12: model = build_model()" in err
    assert 'Fix: move that code into a function called under `if __name__ == "__main__":`' in err


def test_a_guarded_script_is_imported_without_its_main_code_or_the_advisors_argv(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(GUARDED)
    build = cli.load_target(f"{script}:build_model", {"width": 5})
    assert build().output_shape == (None, 5)
    assert cli._import(str(script)).KEPT_ARGV == [str(script.resolve())]


def test_an_exit_the_check_cannot_see_is_refused_with_the_fix(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import helper\ndef build_model():\n    return None\n")
    (tmp_path / "helper.py").write_text("raise SystemExit(3)\n")
    with pytest.raises(AdviseError, match=r"exited \(status 3\): it runs its main code") as err:
        cli.load_target(f"{script}:build_model", {})
    assert 'Fix: move its main code under `if __name__ == "__main__":`' in str(err.value)
