"""`worldstep train` and `worldstep fidelity` hand their flags to the modules' own parsers."""

from __future__ import annotations

import pytest
from worldstep.cli import main


@pytest.mark.parametrize(("command", "module"), [("train", "worldstep.train"), ("fidelity", "worldstep.fidelity")])
def test_passthrough_help(command, module, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert f"python -m {module}" in capsys.readouterr().out


def test_passthrough_rejects_unknown_flags(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--no-such-flag"])
    assert info.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err
