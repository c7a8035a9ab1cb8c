"""The study reads the guide's ``ivhl sim bec --set system=...`` commands (continuation lines joined)."""

from __future__ import annotations

from bench.studies import sim_bec_systems as study


def test_the_study_finds_every_system_command_of_the_guide_with_its_settings():
    commands = study.guide_commands()
    systems = [next(s for s in sets if s.startswith("system=")) for sets in commands]
    assert sorted(set(systems)) == ["system=dipolar", "system=mixture", "system=spin1"]
    dipolar = commands[systems.index("system=dipolar")]
    assert "dims=3" in dipolar and "dipolar.eps_dd=0.8" in dipolar  # the continuation line's settings are kept
    assert all(not s.startswith("--") for sets in commands for s in sets)
