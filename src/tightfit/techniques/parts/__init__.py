"""Processing by parts (Minakova & Stefanov; planner.py): layers compute their output in
phases of a few rows, in the firing order of the model's cyclo-static dataflow graph, tensors
held in windows; the parts search (phase_search.py) picks the phases per layer."""
from __future__ import annotations

from dataclasses import replace

from tightfit.techniques.interface import PlannedModel
from tightfit.plan.schema import Plan
from tightfit.techniques.interface import Config, Front, Point, Problem, Technique


def draft(model: PlannedModel, config: Config) -> Plan:
    """The plan of `config.settings`: "phases" {layer id or name: phases} and "source" (the
    input's bands), or "rows" per phase everywhere, or neither (one row per phase everywhere, the
    paper's setting); "align", "held" (layers whose outputs stay whole), "inplace"
    (PartsOptions.inplace), "stream_outputs" (PartsOptions.stream_outputs). Placed by
    `config.planner` (None: unplaced, as a search drafts)."""
    from tightfit.techniques.parts.planner import PartsOptions, draft_parts, phases_for_rows, plan_parts

    g = model.graph
    phases, source = config.get("phases"), config.get("source")
    if config.get("rows") is not None:
        phases, source = phases_for_rows(g, config.get("rows"))
    elif phases is None:  # (an empty dict: nothing split, as a search point may be)
        from tightfit.analysis.csdf import max_phases

        phases, source = max_phases(g), min(g.shape(t)[2] for t in g.inputs)  # phases every input has rows for
    options = PartsOptions(align=config.get("align", False), held=config.get("held", ()), inplace=config.get("inplace", False),
                           stream_outputs=config.get("stream_outputs", False))
    if config.planner is None:
        return draft_parts(model, phases, source, config.layout, config.dtype, options)
    return plan_parts(model, phases, source, config.planner, config.layout, config.dtype, options)


def config_of(setting, layout: str = "nhwc", dtype: str = "fp32", planner: str | None = None,
              stream_outputs: bool = False) -> Config:
    """The Config that drafts a parts search's setting (phase_search.PartsSetting)."""
    streamed = {"stream_outputs": True} if stream_outputs else {}
    return Config(layout, dtype, planner, settings=dict(phases=setting.phases_dict(), source=setting.source_phases,
                                                        align=setting.align, held=setting.held, **streamed))


def search(problem: Problem) -> Front | None:
    """The parts search (phase_search.search_parts) for the budget: its front, its pick and its
    smallest (found by its memory side), each configured by a Config. As one of fit's sources
    (`brief`) it offers nothing without a budget or on a CNN searched quickly (fit's
    parts-everywhere seed stands for it)."""
    from tightfit.techniques.parts.phase_search import search_parts

    if problem.brief and (problem.budget_bytes is None or problem.quick):
        return None
    c = problem.config
    stream = bool(c.get("stream_outputs", False))
    found = search_parts(problem.model, problem.seconds, problem.budget_bytes, config=c,
                         deadline=problem.deadline, progress=problem.progress)

    def point(p: Point, exact: bool = False) -> Point:
        return replace(p, config=config_of(p.config, c.layout, c.dtype, stream_outputs=stream), exact=exact)

    smallest = point(found.smallest, not found.timed_out)
    chosen = smallest if found.chosen == found.smallest else point(found.chosen)
    return Front(tuple(point(p) for p in found.front), chosen, smallest, found.fits, found.evaluated,
                 found.timed_out, found)


TECHNIQUE = Technique("parts", "layers by row bands in CSDF firing order (Minakova & Stefanov)", draft, search,
                      fit_source=True, fit_share=2.0)
