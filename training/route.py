"""A training route: one base run, fine-tunes of it side by side, and their weight average.

The shipped speech-commands model is not one `dlr-train` run but a route of them: a base run
from scratch, a few fine-tunes of its weights with different augmentation (run side by side,
one per core), and the average of the fine-tunes with their start (`training/soup.py`). A route
file (TOML, `training/routes/`) names the stages; this module runs them:

    python -m training.route training/routes/kws-budget.toml --out-dir runs/kws_route

    <out-dir>/base/           the base run (a `dlr-train` run directory)
    <out-dir>/<fine-tune>/    each fine-tune, started from `base/model`
    <out-dir>/soup/           the average (`training.soup`), its `model/` is the route's model
    <out-dir>/<stage>.log     each stage's output
    <out-dir>/route.json      each stage's command, state and minutes; the route's total

Route file fields: `recipe` (a `dlr-train` recipe), `common` (arguments of every training
stage), `base` (the base run's own), `fine_tune_common` and `[fine_tunes]` (name = its own
arguments), `parallel` (fine-tunes at a time), `[soup]` with `checkpoint` (`model`, `last` or
`ema`) and `with_start`. The route adds `--out-dir`, `--resume` and, for a fine-tune,
`--init-from <out-dir>/base/model`; a route file must not set them.

Resumable: a stage whose run directory holds a `summary.json` (a finished run, or one its own
`--max-minutes` stopped) is done and skipped; any other is (re)started with `--resume`, so an
interrupted route continues from each run's last saved step. A stage that fails stops the
route with the stage's name and log. A route file edited after its stages ran is refused in
the same `--out-dir` (its runs would mix two routes): use a new one.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from training.trainer import CHECKPOINTS

RESERVED = ("--out-dir", "--resume", "--init-from")
BASE = "base"
SOUP = "soup"
ROUTE_JSON = "route.json"


class RouteError(ValueError):
    """A route file that cannot be run, or a stage that failed (the message says which)."""


@dataclass(frozen=True)
class SoupSpec:
    checkpoint: str = "ema"  # which checkpoint of each fine-tune: model, last or ema
    with_start: bool = True  # also average in the base run's model


@dataclass(frozen=True)
class Route:
    """What a route file says (see the module docstring)."""

    recipe: str
    common: tuple[str, ...]
    base: tuple[str, ...]
    fine_tune_common: tuple[str, ...]
    fine_tunes: dict[str, tuple[str, ...]]
    parallel: int = 2
    soup: SoupSpec = field(default_factory=SoupSpec)

    def base_args(self, out: Path) -> list[str]:
        return [self.recipe, *self.common, *self.base, "--out-dir", str(out / BASE), "--resume"]

    def fine_tune_args(self, out: Path, name: str) -> list[str]:
        return [
            self.recipe,
            *self.common,
            *self.fine_tune_common,
            *self.fine_tunes[name],
            *("--init-from", str(out / BASE / "model")),
            *("--out-dir", str(out / name), "--resume"),
        ]

    def soup_args(self, out: Path) -> list[str]:
        args = ["--checkpoint", self.soup.checkpoint, "--out", str(out / SOUP)]
        if self.soup.with_start:
            args.append("--with-start")
        return [*args, *(str(out / name) for name in self.fine_tunes)]


def _words(value: Any, where: str) -> tuple[str, ...]:
    """A list of arguments or one shell-quoted string of them."""
    if isinstance(value, str):
        words = shlex.split(value)
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise RouteError(f"{where}: expected a string or a list of strings, got {value!r}")
    for w in words:
        if w.split("=", 1)[0] in RESERVED:
            raise RouteError(f"{where}: {w} is set by the route, not by the route file")
    return tuple(words)


def load_route(path: Path) -> Route:
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RouteError(f"{path}: {e}") from e
    known = {"recipe", "common", "base", "fine_tune_common", "fine_tunes", "parallel", "soup"}
    extra = sorted(set(raw) - known)
    if extra:
        raise RouteError(f"{path}: unknown fields {extra}; expected some of {sorted(known)}")
    if not isinstance(raw.get("recipe"), str):
        raise RouteError(f"{path}: `recipe` (a dlr-train recipe name) is required")
    tunes = raw.get("fine_tunes", {})
    if not isinstance(tunes, dict) or not tunes:
        raise RouteError(f"{path}: `[fine_tunes]` needs at least one fine-tune")
    clash = sorted({BASE, SOUP} & set(tunes))
    if clash:
        raise RouteError(f"{path}: fine-tunes cannot be named {clash} (the route's own stages)")
    parallel = raw.get("parallel", 2)
    if not isinstance(parallel, int) or parallel < 1:
        raise RouteError(f"{path}: `parallel` must be an integer >= 1, got {parallel!r}")
    soup_raw = raw.get("soup", {})
    if not isinstance(soup_raw, dict) or sorted(set(soup_raw) - {"checkpoint", "with_start"}):
        raise RouteError(f"{path}: `[soup]` takes `checkpoint` and `with_start`, got {soup_raw!r}")
    soup = SoupSpec(
        checkpoint=soup_raw.get("checkpoint", "ema"), with_start=soup_raw.get("with_start", True)
    )
    if soup.checkpoint not in CHECKPOINTS:
        raise RouteError(f"{path}: soup.checkpoint must be one of {list(CHECKPOINTS)}")
    if not isinstance(soup.with_start, bool):
        raise RouteError(f"{path}: soup.with_start must be true or false")
    return Route(
        recipe=raw["recipe"],
        common=_words(raw.get("common", []), "common"),
        base=_words(raw.get("base", []), "base"),
        fine_tune_common=_words(raw.get("fine_tune_common", []), "fine_tune_common"),
        fine_tunes={name: _words(v, f"fine_tunes.{name}") for name, v in tunes.items()},
        parallel=parallel,
        soup=soup,
    )


def stage_done(run: Path) -> bool:
    """A run directory with a summary: finished, or stopped by its own time budget."""
    return (run / "summary.json").is_file()


PHASES = ("base", "fine_tunes", "soup")


@dataclass(frozen=True)
class Earlier:
    """What earlier invocations of the route recorded in `route.json`."""

    minutes: dict[str, float] = field(default_factory=dict)  # per stage
    phase_minutes: dict[str, float] = field(default_factory=dict)
    args: dict[str, list[str]] = field(default_factory=dict)  # per stage, minus the interpreter


def _earlier(path: Path) -> Earlier:
    try:
        report = json.loads(path.read_text())
        return Earlier(
            minutes={s["name"]: float(s["minutes"]) for s in report["stages"]},
            phase_minutes={k: float(v) for k, v in report["phase_minutes"].items()},
            args={s["name"]: shlex.split(s["command"])[1:] for s in report["stages"]},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return Earlier()


@dataclass
class StageRecord:
    name: str
    command: str
    state: str = "pending"  # pending, skipped (done before), done, failed
    minutes: float = 0.0  # the stage's wall clock, summed over the invocations that ran it


class RouteRunner:
    """Runs a route's stages as subprocesses, writing `route.json` as it goes."""

    def __init__(self, route: Route, out: Path, python: str = sys.executable) -> None:
        self.route, self.out = route, out
        train = [python, "-m", "training.cli"]
        self.commands: dict[str, list[str]] = {BASE: [*train, *route.base_args(out)]}
        for name in route.fine_tunes:
            self.commands[name] = [*train, *route.fine_tune_args(out, name)]
        self.commands[SOUP] = [python, "-m", "training.soup", *route.soup_args(out)]
        self.records = {n: StageRecord(n, shlex.join(c)) for n, c in self.commands.items()}
        # a resumed route adds to the wall clock its earlier invocations spent; a stage whose
        # run exists but was started by a different route file would mix two routes: refused
        earlier = _earlier(out / ROUTE_JSON)
        self.phase_minutes = dict(earlier.phase_minutes)
        for name, rec in self.records.items():
            rec.minutes = earlier.minutes.get(name, 0.0)
            before = earlier.args.get(name)
            if before is not None and before != self.commands[name][1:] and (out / name).exists():
                raise RouteError(
                    f"stage {name} in {out} was run with other arguments than the route file "
                    f"gives now; use a new --out-dir, or remove {out / name} to run it again"
                )
        self.t0 = time.perf_counter()

    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        self._phase("base", [BASE], parallel=1)
        self._phase("fine_tunes", list(self.route.fine_tunes), parallel=self.route.parallel)
        self._phase("soup", [SOUP], parallel=1)
        return self._write()

    def _phase(self, phase: str, names: list[str], parallel: int) -> None:
        """Run the phase's stages that are not done, `parallel` at a time; raise if one fails."""
        todo = []
        for name in names:
            if stage_done(self.out / name):
                self.records[name].state = "skipped"
                print(f"[route] {name}: done before, skipped", flush=True)
            else:
                todo.append(name)
        if not todo:
            return
        t0 = time.perf_counter()
        running: dict[str, tuple[subprocess.Popen, float, IO[str]]] = {}
        failed: list[str] = []
        while todo or running:
            while todo and len(running) < parallel and not failed:
                name = todo.pop(0)
                log = (self.out / f"{name}.log").open("a")
                print(f"[route] {name}: started ({self._elapsed()})", flush=True)
                proc = subprocess.Popen(self.commands[name], stdout=log, stderr=subprocess.STDOUT)
                running[name] = (proc, time.perf_counter(), log)
            if failed and not running:
                break
            time.sleep(0.2)
            for name, (proc, start, log) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[name]
                rec = self.records[name]
                rec.minutes = round(rec.minutes + (time.perf_counter() - start) / 60, 2)
                rec.state = "done" if proc.returncode == 0 else "failed"
                print(f"[route] {name}: {rec.state} ({self._elapsed()})", flush=True)
                if proc.returncode != 0:
                    failed.append(name)
        spent = (time.perf_counter() - t0) / 60
        self.phase_minutes[phase] = round(self.phase_minutes.get(phase, 0.0) + spent, 2)
        self._write()
        if failed:
            logs = ", ".join(str(self.out / f"{n}.log") for n in failed)
            raise RouteError(f"stage {', '.join(failed)} failed; see {logs}")

    def _elapsed(self) -> str:
        return f"route at {(time.perf_counter() - self.t0) / 60:.1f} min"

    def _write(self) -> dict[str, Any]:
        phases = {p: self.phase_minutes.get(p, 0.0) for p in PHASES}
        report = {
            "recipe": self.route.recipe,
            "stages": [vars(r) for r in self.records.values()],
            "phase_minutes": phases,  # wall clock of each phase, over every invocation
            "minutes": round(sum(phases.values()), 2),
            "model": str(self.out / SOUP / "model"),
        }
        (self.out / ROUTE_JSON).write_text(json.dumps(report, indent=1))
        return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.route", description=__doc__.split("\n")[0])
    p.add_argument(
        "route", type=Path, help="a route file (TOML), e.g. training/routes/kws-budget.toml"
    )
    p.add_argument("--out-dir", type=Path, required=True, help="where the stages' runs go")
    p.add_argument("--dry-run", action="store_true", help="print the stages' commands and stop")
    args = p.parse_args(argv)
    try:
        runner = RouteRunner(load_route(args.route), args.out_dir)
        if args.dry_run:
            for rec in runner.records.values():
                print(f"{rec.name}: {rec.command}")
            return 0
        report = runner.run()
    except RouteError as e:
        print(f"route: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
