"""What ``ivhl tune`` can measure: tuning areas and XLA-flag workloads, registered by the families that own them.

A family (``ivhl_jax.physics.tunables``, ``ivhl_jax.nn.tunables``, ``ivhl_jax.models.tunables``) registers an
:class:`Area`: a function that builds :class:`Candidate` settings of its own kernels and hands them to the tuner
(:class:`Tuner`, implemented by :mod:`ivhl_jax.run.tune`), which checks, times and records them. The tuner knows no
family and the families know no tuner module: this registry, in the lowest layer, is all they share.

Registering is a dictionary insert (no file, no environment variable, no output); the tuner reads
:func:`areas` and :func:`workloads` when it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

__all__ = ["Candidate", "Tuner", "Area", "register", "areas", "register_workload", "workloads"]


@dataclasses.dataclass
class Candidate:
    """One setting to time: ``settings`` (backend table fields, or for other knobs what the entry records) and
    ``build() -> (compiled, args)``; ``compiled(*args)`` runs it once. ``default`` marks the table's choice (the
    reference output the others must equal)."""

    name: str
    settings: dict[str, Any]
    build: Callable[[], tuple[Any, tuple]]
    default: bool = False


class Tuner(Protocol):
    """What an area's function gets from the tuner (:class:`ivhl_jax.run.tune.Session`)."""

    quick: bool  # --quick: one or two sizes per area
    tiny: bool  # IVHL_TUNE_TINY=1: every size shrunk to seconds (tests)
    verify: bool  # --verify: add the call with no settings under the tuning cache as a candidate
    limits: Mapping[str, Any]  # this machine's measured copy bandwidth and matmul peaks

    def choose(
        self,
        op: str,
        size: int | None,
        candidates: Sequence[Candidate],
        *,
        rounds: int,
        rtol: float = 1e-4,
        check: Callable[[Any], str | None] | None = None,
        dtype: str = "f32",
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Check, time and rank ``candidates``; returns the cache entry (winner, settings, statistics)."""
        ...

    def aot(
        self, fn: Callable, *args: Any, settings: Mapping[str, Any] | None = None, cached: bool = False
    ) -> tuple[Any, tuple]:
        """``fn(*args)`` compiled under the table row plus ``settings`` (``cached``: under the tuning cache)."""
        ...

    def log(self, msg: str) -> None:
        """Progress on the console."""
        ...

    def note(self, msg: str) -> None:
        """Something the area left out or could not measure here, and why (console and the result's notes)."""
        ...


@dataclasses.dataclass(frozen=True)
class Area:
    """A tuning area (``ivhl tune --only NAME``).

    Attributes:
      name: the area's name.
      run: ``run(tuner) -> {"op|bucket": entry}``: builds candidates and returns ``tuner.choose``'s entries.
      quick: whether ``ivhl tune --quick`` runs it.
      order: where it runs among the areas (smaller first).
      at_size: ``at_size(tuner, op, size) -> entries`` tunes one op at one problem size (``IVHL_TUNING=auto``),
        or None.
      ops: the ops ``at_size`` handles.
    """

    name: str
    run: Callable[[Tuner], dict[str, dict[str, Any]]]
    quick: bool = True
    order: int = 50
    at_size: Callable[[Tuner, str, int], dict[str, dict[str, Any]]] | None = None
    ops: tuple[str, ...] = ()


_AREAS: dict[str, Area] = {}
_WORKLOADS: dict[str, Callable[[bool], tuple[Callable, tuple]]] = {}


def register(area: Area) -> Area:
    """Add (or replace) a tuning area; returns it."""
    if not isinstance(area, Area) or not area.name:
        raise TypeError(f"register takes an Area with a name, got {area!r}")
    _AREAS[area.name] = area
    return area


def areas() -> dict[str, Area]:
    """The registered areas, in running order."""
    return {a.name: a for a in sorted(_AREAS.values(), key=lambda a: (a.order, a.name))}


def register_workload(name: str, build: Callable[[bool], tuple[Callable, tuple]]) -> None:
    """Add a kernel the XLA-flag area times under every flag configuration: ``build(tiny) -> (fn, args)``, ``fn`` a
    pure function of arrays (jitted by the tuner's worker process; outputs compared across configurations). The
    argument is the tuner's ``tiny``."""
    _WORKLOADS[name] = build


def workloads() -> dict[str, Callable[[bool], tuple[Callable, tuple]]]:
    """The registered XLA-flag workloads, by name."""
    return dict(sorted(_WORKLOADS.items()))
