"""`decide`: everything one reconcile of a policy does, decided from the policy and a `ClusterView`.

    view = ClusterView.of(observed, policy.spec, policy.status)
    decision = decide(policy, view)
    decision.problems    # errors: nothing is written while there is one
    decision.plan        # what to write, what to restart, which events (plan.Plan)
    decision.outcome()   # what status will say (status.Outcome), given what the writes did

Pure: no I/O. The operator executes the decision (`reconcile`); `vgpuctl render`, `diff` and
`doctor` show the same one, so what they say the operator would do is what it does.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

from vgpu_operator import api
from vgpu_operator.observed import Observed
from vgpu_operator.plan import Plan, Restart, make_plan, previous_from_status
from vgpu_operator.registry import RenderResult, render_targets
from vgpu_operator.render.inputs import Problem
from vgpu_operator.status import NodeReport, Outcome, report_nodes
from vgpu_operator.validate import validate
from vgpu_operator.view import ClusterView, view_of

Result = Literal["ok", "invalid", "conflict", "paused"]


@dataclass(frozen=True)
class Decision:
    """What a reconcile does and reports. `plan` is None when nothing may be written (a conflict
    or an invalid policy); `render` is None when nothing was rendered (a conflict, a spec the
    model refuses)."""

    generation: int | None
    result: Result
    problems: Sequence[str] = ()  # errors, each naming the field and the fix
    warnings: Sequence[str] = ()
    found: Sequence[Problem] = ()  # the problems as found, errors first (for vgpuctl)
    nodes: Sequence[NodeReport] = ()
    render: RenderResult | None = None
    plan: Plan | None = None
    conflict_with: str | None = None
    paused: bool = False
    rolled: Sequence[Restart] = field(default_factory=list)  # rollouts an interrupted reconcile made

    def outcome(self, apply_error: str | None = None, restarts: Sequence[Restart] = (),
                written: frozenset[str] = frozenset()) -> Outcome:
        """What status says once the plan was executed: `apply_error` if a write failed (and the
        targets `written` before it), the `restarts` that did happen."""
        return Outcome(self.generation, problems=self.problems, warnings=self.warnings,
                       conflict_with=self.conflict_with, plan=self.plan, apply_error=apply_error,
                       written=written, nodes=self.nodes, paused=self.paused, restarts=restarts)


def render_all(policy: api.VGPUPolicy | api.VGPUPolicySpec, observed: Observed) -> RenderResult:
    """Every target rendered for a policy (its stored status included) or a bare spec."""
    return render_targets(view_of(observed, policy))


def conflict(generation: int | None, active: str | None) -> Decision:
    """This policy is not the active one: it writes nothing and says which one is."""
    return Decision(generation, "conflict", conflict_with=active)


def rejected(generation: int | None, problems: Sequence[str]) -> Decision:
    """The spec does not load (a field the model refuses): nothing rendered, nothing written."""
    return Decision(generation, "invalid", problems=problems)


def decide(policy: api.VGPUPolicy, view: ClusterView, *, generation: int | None = None,
           recreated: Collection[str] = ()) -> Decision:
    """Decide one reconcile of the active `policy`. `recreated`: nodes whose plugin pod this
    process already recreated for the restarts announced on the view's ConfigMaps (a retry after
    a late failure must not restart them twice)."""
    spec = view.spec
    render = render_targets(view)
    # Any error blocks every write (a partial apply is how the four places drift apart); the
    # renderers' own errors are among validate's, at the catalogue's severity.
    found = validate(policy, view, render)
    problems = [str(p) for p in found if p.severity == "error"]
    warnings = [str(p) for p in found if p.severity != "error"]
    node_config = render.of("node_config")
    nodes = report_nodes(view.nodes, spec, node_config.node_splits if node_config else {},
                         view.device_plugin)
    if problems:
        return Decision(generation, "invalid", problems, warnings, found, nodes, render)
    pending = view.pending
    announced = {str(n["metadata"]["name"]) for n in view.nodes} if pending.all_nodes else set(pending.nodes)
    plan = make_plan(render.targets, previous_from_status(view.previous),
                     enforce=spec.drift_policy == "Enforce", paused=spec.paused,
                     builtin_plugin=view.generation == "builtin", pending_nodes=announced - set(recreated))
    result: Result = "paused" if spec.paused else "ok"
    return Decision(generation, result, problems, warnings, found, nodes, render, plan,
                    paused=spec.paused, rolled=view.rolled)
