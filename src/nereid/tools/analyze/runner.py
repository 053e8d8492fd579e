"""`run_analyze`: the whole analysis. Start (or reach) the server, measure the model's own config, let the
search strategy pick variants to load and measure until it is done or the time budget is spent, then choose
the best config for each objective, write it into the output repository and write the report."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable

from nereid.tools.analyze.budget import TimeBudget
from nereid.tools.analyze.deployment import RepositoryClient, TargetServer, connect_server, start_server
from nereid.tools.analyze.export import write_best_config
from nereid.tools.analyze.measurement import measure_variant
from nereid.tools.analyze.model_config import (
    ModelConfig,
    config_from_server_json,
    config_to_load_json,
    config_to_pbtxt,
    is_ensemble,
    read_config_file,
)
from nereid.tools.analyze.objectives import Constraints, best_pick, variant_score
from nereid.tools.analyze.report import write_report
from nereid.tools.analyze.resources import ResourceMonitor
from nereid.tools.analyze.results import AnalyzeResult, VariantOutcome
from nereid.tools.analyze.search_space import SearchSpace, Variant, apply_variant, variant_of_config
from nereid.tools.analyze.settings import AnalyzeError, AnalyzeSettings
from nereid.tools.analyze.strategies import make_strategy
from nereid.tools.perf import PerfError

__all__ = ["Progress", "run_analyze"]

Progress = Callable[[str], None]


class _Run:
    """State of one analysis while it runs."""

    def __init__(self, settings: AnalyzeSettings, say: Progress) -> None:
        self.settings = settings
        self.say = say
        self.budget = TimeBudget(settings.time_budget_s, settings.measurement_interval_ms, settings.warmup_s)
        self.constraints = Constraints(settings.max_p99_latency_ms, settings.min_throughput, settings.max_memory_mb)
        self.model_dir = settings.model_repository / settings.model if settings.model_repository is not None else None
        self.disk_config: ModelConfig | None = None
        self.disk_text: str | None = None

    def stamp(self) -> str:
        return f"[{self.budget.elapsed():6.1f}s/{self.settings.time_budget_s:g}s]"

    def check_model_folder(self) -> None:
        if self.model_dir is None:
            return
        if not self.model_dir.is_dir():
            raise AnalyzeError(f"unknown model '{self.settings.model}': there is no folder {self.model_dir}")
        path = self.model_dir / "config.pbtxt"
        if path.is_file():
            self.disk_config = read_config_file(path)
            self.disk_text = path.read_text()
            if is_ensemble(self.disk_config):
                raise AnalyzeError(f"model '{self.settings.model}' is an ensemble: analyze its composing models instead")

    def server(self) -> TargetServer:
        s = self.settings
        if s.url:
            return connect_server(s.url, s.grpc_url, s.metrics_url)
        assert s.model_repository is not None
        self.say(f"{self.stamp()} starting nereid serve (explicit model control) on {s.model_repository}")
        return start_server(s.model_repository, s.output_dir / "server.log", s.server_start_timeout_s)


def run_analyze(settings: AnalyzeSettings, progress: Progress | None = None) -> AnalyzeResult:
    """Search configs of `settings.model`, write the best ones and the report under `settings.output_dir`.

    Raises `AnalyzeError` (one clear line) for bad settings, an unknown model, an unreachable server or a model
    that cannot be measured with its own config; later failures of single variants are recorded instead.
    """
    settings.validate()
    if importlib.util.find_spec("matplotlib") is None:
        raise AnalyzeError("the report's charts need matplotlib: pip install 'nereid[analyze]'")
    say: Progress = progress or (lambda line: None)
    run = _Run(settings, say)
    run.check_model_folder()
    _check_output_dir(settings)
    server = run.server()
    result = AnalyzeResult(
        model=settings.model,
        server=server.description,
        mode=settings.mode,
        objectives=list(settings.objectives),
        constraints=run.constraints.as_dict(),
        search_space="",
        resource_source="",
        time_budget_s=settings.time_budget_s,
    )
    try:
        _search(run, server, result)
    finally:
        server.stop()
    result.elapsed_s = run.budget.elapsed()
    _finish(run, result)
    return result


def _check_output_dir(settings: AnalyzeSettings) -> None:
    out = settings.output_dir.resolve()
    if settings.model_repository is not None and out == settings.model_repository.resolve():
        raise AnalyzeError("--output-dir: must not be the model repository itself (the best configs would become models there)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnalyzeError(f"--output-dir: cannot create {out}: {exc.strerror or exc}") from None


def _load(run: _Run, client: RepositoryClient, config_json: str | None) -> float:
    settings = run.settings
    started = time.monotonic()
    if client.model_state(settings.model) == "READY":
        client.unload(settings.model, settings.load_timeout_s)
    client.load(settings.model, config_json, settings.load_timeout_s)
    elapsed = time.monotonic() - started
    run.budget.observe_load(elapsed)
    return elapsed


def _search(run: _Run, server: TargetServer, result: AnalyzeResult) -> None:
    settings, say = run.settings, run.say
    client = RepositoryClient(server.http_url)
    state = client.model_state(settings.model)
    if state is None:
        names = sorted({str(e.get("name", "")) for e in client.index()})
        held = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "") if names else "no models"
        raise AnalyzeError(f"unknown model '{settings.model}': {server.description} does not have it in its repository (it has {held})")
    initially_ready = state == "READY"
    say(f"{run.stamp()} loading '{settings.model}' with its own config (the baseline)")
    try:
        load_s = _load(run, client, None)
    except AnalyzeError as exc:
        if "not allowed" in str(exc):
            raise AnalyzeError(f"{server.description} does not allow loading models: start it with --model-control-mode=explicit ({exc})") from None
        raise AnalyzeError(f"model '{settings.model}' does not load with its own config: {exc}") from None
    try:
        _measure_all(run, client, server, result, load_s)
    except KeyboardInterrupt:
        result.stopped_early = "interrupted"
    finally:
        if not server.owned and server.exited() is None:
            _restore(run, client, initially_ready, result)


def _measure_all(run: _Run, client: RepositoryClient, server: TargetServer, result: AnalyzeResult, load_s: float) -> None:
    """The baseline, then what the strategy proposes, until it is done or the budget is spent."""
    settings, say = run.settings, run.say
    effective = config_from_server_json(client.model_config(settings.model))
    if is_ensemble(effective):
        raise AnalyzeError(f"model '{settings.model}' is an ensemble: analyze its composing models instead")
    base = run.disk_config if run.disk_config is not None else effective
    space = SearchSpace(settings, effective, result.notes)
    baseline = variant_of_config(effective)
    monitor = ResourceMonitor(server.pid, server.metrics_url)
    result.search_space = space.describe()
    result.resource_source = monitor.source
    result.variants_in_space = len(space.all_variants())
    primary = settings.objectives[0]
    strategy = make_strategy(settings.mode, space, baseline)
    say(
        f"{run.stamp()} model '{settings.model}' on {server.description}; {settings.mode} search over {result.variants_in_space} "
        f"configurations ({result.search_space}); concurrency {settings.concurrency}; objectives {', '.join(settings.objectives)}"
    )
    baseline_text = run.disk_text if run.disk_text is not None else config_to_pbtxt(effective)
    outcome = VariantOutcome("baseline", baseline, baseline_text, 1, load_s=load_s)
    say(f"{run.stamp()} 1. baseline (the model's own config): {baseline.describe()}")
    result.outcomes.append(outcome)
    try:
        measure_variant(settings, server, monitor, outcome, run.constraints, run.budget, say)
    except PerfError as exc:
        if not outcome.measurements:
            raise AnalyzeError(f"measuring model '{settings.model}' with its own config failed: {exc}") from None
        outcome.error = str(exc)
        say(f"    measurement failed: {exc}")
    if not outcome.complete:
        _out_of_time(run, result, "the model's own config was not fully measured")
        return
    strategy.record(baseline, variant_score(primary, outcome, run.constraints))
    measured: dict[Variant, VariantOutcome] = {baseline: outcome}
    while True:
        if settings.max_variants and len(result.outcomes) >= settings.max_variants:
            result.stopped_early = f"--max-variants {settings.max_variants} reached ({strategy.status()})"
            return
        variant = strategy.next_variant()
        if variant is None:
            return
        if variant in measured:
            strategy.record(variant, variant_score(primary, measured[variant], run.constraints))
            continue
        if not run.budget.fits_variant():
            _out_of_time(run, result, strategy.status())
            return
        outcome = _try_variant(run, client, server, monitor, base, variant, len(result.outcomes) + 1)
        measured[variant] = outcome
        result.outcomes.append(outcome)
        strategy.record(variant, variant_score(primary, outcome, run.constraints))
        fatal = server.exited()
        if fatal is not None:
            result.fatal = fatal
            return
        if not outcome.complete:
            _out_of_time(run, result, strategy.status())
            return


def _out_of_time(run: _Run, result: AnalyzeResult, status: str) -> None:
    result.stopped_early = f"the time budget of {run.settings.time_budget_s:g} s is spent ({status})"
    run.say(f"{run.stamp()} time budget spent: stopping the search ({status})")


def _try_variant(
    run: _Run,
    client: RepositoryClient,
    server: TargetServer,
    monitor: ResourceMonitor,
    base: ModelConfig,
    variant: Variant,
    order: int,
) -> VariantOutcome:
    config = apply_variant(base, variant)
    outcome = VariantOutcome(variant.name, variant, config_to_pbtxt(config), order)
    run.say(f"{run.stamp()} {order}. {variant.name}: {variant.describe()}")
    try:
        outcome.load_s = _load(run, client, config_to_load_json(config))
    except AnalyzeError as exc:
        outcome.error = f"load failed: {exc}"
        run.say(f"    {outcome.error}")
        return outcome
    run.say(f"    loaded in {outcome.load_s:.2f} s")
    try:
        measure_variant(run.settings, server, monitor, outcome, run.constraints, run.budget, run.say)
    except PerfError as exc:
        outcome.error = str(exc)
        run.say(f"    measurement failed: {exc}")
    return outcome


def _restore(run: _Run, client: RepositoryClient, initially_ready: bool, result: AnalyzeResult) -> None:
    """Leave a server analyze did not start as it was: the model loaded with its own config, or unloaded."""
    model = run.settings.model
    try:
        if initially_ready:
            _load(run, client, None)
            run.say(f"{run.stamp()} '{model}' reloaded with its own config")
        elif client.model_state(model) == "READY":
            client.unload(model, run.settings.load_timeout_s)
            run.say(f"{run.stamp()} '{model}' unloaded again")
    except AnalyzeError as exc:
        result.notes.append(f"could not restore '{model}' on the server afterwards: {exc}")


def _finish(run: _Run, result: AnalyzeResult) -> None:
    settings, say = run.settings, run.say
    for objective in settings.objectives:
        pick = best_pick(objective, result.outcomes)
        if pick is None:
            continue
        try:
            pick.config_path = write_best_config(pick, settings.model, settings.output_dir, run.model_dir, settings.copy_model_files)
        except OSError as exc:
            raise AnalyzeError(f"cannot write the best config for {objective}: {exc}") from None
        result.best[objective] = pick
    try:
        files = write_report(result, settings.output_dir)
    except OSError as exc:
        raise AnalyzeError(f"cannot write the report into {settings.output_dir}: {exc}") from None
    measured = sum(1 for o in result.outcomes if o.measured)
    say(f"{run.stamp()} done: {measured} configuration(s) measured, {len(result.measurements)} measurement(s)")
    for objective in settings.objectives:
        pick = result.best.get(objective)
        if pick is None:
            say(f"  {objective}: no measured configuration meets the constraints")
        else:
            m = pick.measurement
            say(
                f"  {objective}: {pick.outcome.label} at concurrency {m.concurrency}: {m.throughput:,.1f} infer/s, "
                f"p99 {m.p99_ms:.2f} ms -> {pick.config_path}"
            )
    say(f"  report: {files['html']}")

