"""The embodiment registry: diffusers' own tables, the extras, a checkpoint's own, and every refusal."""

from __future__ import annotations

import importlib.util
import json
import runpy
import sys
from importlib.resources import files
from pathlib import Path

import pytest
import torch
from diffusers.pipelines.cosmos import pipeline_cosmos3_omni as omni
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from worldstep.engine.embodiment.embodiment import (
    Embodiment,
    EmbodimentSource,
    NormalizationKind,
    embodiment_from_json,
    embodiment_to_json,
    view_points,
)
from worldstep.engine.embodiment.embodiments import (
    EXTRAS,
    TRAINING_DEFAULTS,
    EmbodimentRegistry,
    checkpoint_registry,
    folder_registry,
)

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = EmbodimentRegistry.default()
PUSHER = Path(str(files("worldstep.configs") / "models" / "pusher"))


def test_the_registry_is_the_installed_diffusers_tables():
    """Name -> (id, width) of every diffusers embodiment, read from the installed package, no hand copy."""
    ids, widths = omni._EMBODIMENT_TO_DOMAIN_ID, omni._EMBODIMENT_TO_RAW_ACTION_DIM
    from_diffusers = {e.name: (e.domain_id, e.raw_width) for e in REGISTRY if e.source is EmbodimentSource.DIFFUSERS}
    assert from_diffusers == {name: (ids[name], widths[name]) for name in widths if name in ids}
    assert len(from_diffusers) >= 15  # droid, bridge, agibot, fractal, umi, pusht, ...
    assert set(view_points()) == set(omni._ACTION_VIEWPOINT_TEMPLATES)
    assert set(TRAINING_DEFAULTS) <= set(widths)  # worldstep annotates only names diffusers has
    for name in set(ids) - set(widths):  # no_action, libero: diffusers refuses them, so does worldstep
        with pytest.raises(ValueError, match=name):
            REGISTRY.get(name)
    # the examples
    assert (REGISTRY.get("droid_lerobot").domain_id, REGISTRY.get("droid_lerobot").raw_width) == (8, 10)
    assert (REGISTRY.get("agibotworld").domain_id, REGISTRY.get("agibotworld").raw_width) == (15, 29)
    assert (REGISTRY.get("pusht").domain_id, REGISTRY.get("pusht").raw_width) == (4, 2)


@pytest.mark.parametrize("name", [e.name for e in REGISTRY if e.source is EmbodimentSource.DIFFUSERS])
def test_the_pipeline_accepts_exactly_what_the_registry_accepts(name):
    """CosmosActionCondition takes each registered name at its width and refuses any other width."""
    emb = REGISTRY.get(name)
    image = Image.new("RGB", (32, 32))

    def condition(width):
        return CosmosActionCondition(mode="forward_dynamics", chunk_size=4, domain_name=name,
                                     raw_actions=torch.zeros(4, width), image=image)

    assert condition(emb.raw_width).raw_action_dim == emb.raw_width
    for width in (emb.raw_width - 1, emb.raw_width + 1):
        if width < 1:
            continue
        with pytest.raises(ValueError):
            condition(width)
        with pytest.raises(ValueError, match=f"{name}.*takes exactly {emb.raw_width}"):
            REGISTRY.resolve(name, width=width)


def test_extras_are_the_training_only_domains():
    names = {e.name: (e.domain_id, e.raw_width) for e in EXTRAS}
    assert names["libero_3d"] == (5, 7) and names["libero_6d"] == (5, 10) and names["libero_9d"] == (5, 13)
    assert all(e.source is EmbodimentSource.COSMOS_FRAMEWORK for e in EXTRAS)
    assert not set(names) & set(omni._EMBODIMENT_TO_DOMAIN_ID)  # extras never shadow a diffusers name
    with pytest.raises(ValueError, match="ambiguous.*libero_3d.*libero_6d.*libero_9d"):
        REGISTRY.by_domain_id(5)  # three widths share id 5: the name decides
    assert REGISTRY.resolve("libero_6d", width=10).domain_id == 5


def test_every_name_round_trips():
    for emb in REGISTRY:
        assert REGISTRY.get(emb.name) is emb
        assert REGISTRY.resolve(emb.name, domain_id=emb.domain_id, width=emb.raw_width) is emb
        widths = {e.raw_width for e in REGISTRY.with_domain(emb.domain_id)}
        if len(widths) == 1:  # the id alone names the width
            by_id = REGISTRY.resolve(domain_id=emb.domain_id, width=emb.raw_width)
            assert (by_id.domain_id, by_id.raw_width) == (emb.domain_id, emb.raw_width)
            assert by_id is REGISTRY.with_domain(emb.domain_id)[0]
        assert embodiment_from_json(embodiment_to_json(emb)) == Embodiment(
            emb.name, emb.domain_id, emb.raw_width, emb.default_fps, emb.default_view_point, emb.normalization,
            EmbodimentSource.CHECKPOINT, emb.convention)  # the convention round-trips too
    assert REGISTRY.by_domain_id(8).name == "droid_lerobot"  # diffusers' first name for id 8
    assert REGISTRY.by_domain_id(15).name == "agibotworld"


_TRIPLES = [(e.name, e.domain_id, e.raw_width) for e in REGISTRY]
_NAMES = st.one_of(st.none(), st.sampled_from([t[0] for t in _TRIPLES] + ["no_action", "libero"]),
                   st.text(max_size=12))
_IDS = st.one_of(st.none(), st.integers(-3, 40))
_WIDTHS = st.one_of(st.none(), st.integers(-1, 70))


def _expected(name, domain_id, width):
    """The accepted (name, id, width) by plain enumeration of the registry's triples, or None if refused."""
    if name is None and domain_id is None:
        return None
    if name is not None:
        rows = [t for t in _TRIPLES if t[0] == name and domain_id in (None, t[1])]
    else:
        rows = [t for t in _TRIPLES if t[1] == domain_id]
        if len({t[2] for t in rows}) != 1:
            return None
        rows = rows[:1]
    rows = [t for t in rows if width in (None, t[2])]
    return rows[0] if rows else None


@settings(max_examples=400, deadline=None)
@given(name=_NAMES, domain_id=_IDS, width=_WIDTHS)
def test_every_combination_is_accepted_or_refused_as_the_tables_say(name, domain_id, width):
    expected = _expected(name, domain_id, width)
    if expected is None:
        with pytest.raises(ValueError) as err:
            REGISTRY.resolve(name, domain_id=domain_id, width=width)
        message = str(err.value)
        assert "allowed" in message or "pass embodiment=" in message
    else:
        got = REGISTRY.resolve(name, domain_id=domain_id, width=width)
        assert (got.name, got.domain_id, got.raw_width) == expected


@settings(max_examples=100, deadline=None)
@given(num_domains=st.integers(1, 40), action_dim=st.integers(1, 70), index=st.integers(0, len(_TRIPLES) - 1))
def test_a_checkpoints_head_bounds_the_embodiments(num_domains, action_dim, index):
    name, domain_id, width = _TRIPLES[index]
    if domain_id < num_domains and width <= action_dim:
        assert REGISTRY.resolve(name, num_domains=num_domains, action_dim=action_dim).name == name
    else:
        with pytest.raises(ValueError, match=name):
            REGISTRY.resolve(name, num_domains=num_domains, action_dim=action_dim)
    inside = REGISTRY.within(num_domains)
    assert (name in inside) == (domain_id < num_domains)


def test_refusals_name_the_embodiment_its_width_and_the_allowed_names():
    with pytest.raises(ValueError, match=r"7 wide.*'droid_lerobot' \(domain 8, 10-wide actions\).*allowed names"):
        REGISTRY.resolve("droid_lerobot", width=7)
    with pytest.raises(ValueError, match=r"domain_id=11 has no embodiment.*allowed names"):
        REGISTRY.resolve(domain_id=11)
    with pytest.raises(ValueError, match=r"domain_id=7 contradicts.*'droid_lerobot'"):
        REGISTRY.resolve("droid_lerobot", domain_id=7)
    with pytest.raises(ValueError, match="unknown; allowed: .*droid_lerobot"):
        REGISTRY.resolve("droid")
    with pytest.raises(ValueError, match="libero_3d"):
        REGISTRY.resolve("libero")
    for bad in (True, 8.0, "8"):
        with pytest.raises(ValueError, match="domain_id"):
            REGISTRY.resolve(domain_id=bad)
        with pytest.raises(ValueError, match="width"):
            REGISTRY.resolve("droid_lerobot", width=bad)


def test_the_pusher_checkpoint_registers_its_own_embodiment():
    registry = folder_registry(PUSHER, num_domains=4)
    assert registry.names == ("pusher",)  # its domains are its own: the Cosmos3 names do not apply
    pusher = registry.resolve(domain_id=0, width=2, num_domains=4, action_dim=8)
    assert (pusher.name, pusher.raw_width, pusher.default_fps) == ("pusher", 2, 24.0)
    assert pusher.normalization is NormalizationKind.NONE and pusher.source is EmbodimentSource.CHECKPOINT
    with pytest.raises(ValueError, match=r"droid_lerobot. is not supported by this checkpoint .*allowed: \[.pusher.\]"):
        registry.resolve("droid_lerobot")  # known, only not one of this checkpoint's
    with pytest.raises(ValueError, match="'no_such_robot' is unknown; allowed: \\['pusher'\\]"):
        registry.resolve("no_such_robot")
    # a folder without worldstep.json gets the built-ins
    assert folder_registry(PUSHER / "vae").names == REGISTRY.names


def test_a_checkpoint_may_add_embodiments_next_to_the_builtins():
    meta = {"embodiments": [{"name": "my_arm", "domain_id": 30, "raw_width": 7, "fps": 12}]}
    registry = checkpoint_registry(meta, num_domains=32)
    assert registry.get("my_arm").default_fps == 12.0 and "droid_lerobot" in registry
    assert registry.resolve(domain_id=30).name == "my_arm"
    bad_entries = [
        {"embodiments": [{"name": "droid_lerobot", "domain_id": 8, "raw_width": 10}]},  # clashes
        {"embodiments": [{"name": "x", "domain_id": 1}]},  # no width
        {"embodiments": [{"name": "x", "domain_id": 1, "raw_width": 3, "colour": "red"}]},  # unknown key
        {"embodiments": [{"name": "x", "domain_id": -1, "raw_width": 3}]},
        {"embodiments": [{"name": "x", "domain_id": 1, "raw_width": 0}]},
        {"embodiments": [{"name": "x", "domain_id": 1, "raw_width": 3, "fps": 0}]},
        {"embodiments": [{"name": "x", "domain_id": 1, "raw_width": 3, "view_point": "top"}]},
        {"embodiments": [{"name": "x", "domain_id": 1, "raw_width": 3, "normalization": "minmax"}]},
        {"embodiments": [{"name": "x", "domain_id": 1, "raw_width": 3}, {"name": "x", "domain_id": 2, "raw_width": 3}]},
        {"embodiments": {"name": "x"}},
        {"embodiments": [], "builtin_embodiments": "no"},
    ]
    for meta in bad_entries:
        with pytest.raises(ValueError):
            checkpoint_registry(meta)


def test_the_shipped_pusher_json_matches_what_training_writes():
    from worldstep.train.pusher import EMBODIMENT

    meta = json.loads((PUSHER / "worldstep.json").read_text())
    assert meta["embodiments"] == [EMBODIMENT] and meta["builtin_embodiments"] is False


def _embodiment_table():
    """`tools/embodiment_table.py`, the doc generator, which the installed package does not ship."""
    path = ROOT / "tools" / "embodiment_table.py"
    spec = importlib.util.spec_from_file_location("embodiment_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_generated_from_the_registry(tmp_path):
    table = _embodiment_table()
    BEGIN, END, render, update = table.BEGIN, table.END, table.render, table.update

    readme = (ROOT / "docs" / "embodiments.md").read_text()
    block = readme.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == render(), ("the embodiment table in docs/embodiments.md is stale: "
                               "python tools/embodiment_table.py docs/embodiments.md")
    rows = block.splitlines()[2:]
    assert len(rows) == len(REGISTRY) and "| `droid_lerobot` | 8 | 10 | 15 | concat_view | none | diffusers |" in rows
    stale = tmp_path / "R.md"
    stale.write_text(f"intro\n{BEGIN}\nold\n{END}\noutro\n")
    assert update(stale) and not update(stale)
    assert stale.read_text() == f"intro\n{BEGIN}\n{render()}\n{END}\noutro\n"
    stale.write_text("no markers")
    with pytest.raises(ValueError, match="lacks the markers"):
        update(stale)


def test_the_table_generator_runs_from_tools_and_is_not_in_the_package(monkeypatch, capsys):
    """The command the docs' marker names runs as a script (in this process: `runpy` runs the file as
    ``python`` does) and prints the table; the runtime package no longer holds the generator."""
    assert importlib.util.find_spec("worldstep.embodiment_table") is None
    command = _embodiment_table().BEGIN.split("(", 1)[1].split(")", 1)[0].split()
    assert command[:2] == ["python", "tools/embodiment_table.py"]
    monkeypatch.setattr(sys, "argv", [command[1]])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / command[1]), run_name="__main__")
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == _embodiment_table().render()
