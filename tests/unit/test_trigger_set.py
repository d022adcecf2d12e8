"""Tasks to trigger (SPEC G4): the linear walk of FLIP-147's appendix against the quadratic
definition, by hand-made graphs, random graphs, and counted work (never timing)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

import pytest

from batchline.streams.trigger import (
    EdgeKind,
    TriggerVertex,
    pointwise_downstream,
    pointwise_upstream,
    tasks_to_trigger,
)

A2A = EdgeKind.ALL_TO_ALL
PW = EdgeKind.POINTWISE


def _predecessors(j: int, m: int, n: int, kind: EdgeKind) -> Sequence[int]:
    """Upstream partitions (of ``m``) that downstream partition ``j`` (of ``n``) reads."""
    if kind is A2A:
        return range(m)
    if m >= n:
        return pointwise_upstream(j, m, n)
    return [i for i in range(m) if j in pointwise_downstream(i, m, n)]


def running_roots_brute_force(
    vertices: Sequence[TriggerVertex],
    finished: Mapping[int, AbstractSet[int]],
    work: list[int] | None = None,
) -> list[tuple[int, int]]:
    """The definition, task by task: running, and no predecessor task running. Quadratic."""
    by_id = {v.vertex_id: v for v in vertices}
    roots = []
    checks = 0
    for v in vertices:
        done = finished.get(v.vertex_id, frozenset())
        for j in range(v.parallelism):
            if j in done:
                continue
            free = True
            for upstream_id, kind in v.inputs:
                up_done = finished.get(upstream_id, frozenset())
                for i in _predecessors(j, by_id[upstream_id].parallelism, v.parallelism, kind):
                    checks += 1
                    if i not in up_done:
                        free = False
            if free:
                roots.append((v.vertex_id, j))
    if work is not None:
        work[0] += checks
    return roots


def _size(vertices: Sequence[TriggerVertex]) -> int:
    """V + E + tasks."""
    return sum(1 + len(v.inputs) + v.parallelism for v in vertices)


def _check(vertices, finished, expected=None):
    work = [0]
    got = tasks_to_trigger(vertices, finished, work=work)
    assert got == running_roots_brute_force(vertices, finished)
    if expected is not None:
        assert got == expected
    assert work[0] <= 8 * _size(vertices) + 8
    return got


# ---- the pointwise mapping ----------------------------------------------------------------


@pytest.mark.parametrize("m", range(1, 13))
@pytest.mark.parametrize("n", range(1, 13))
def test_pointwise_helpers_follow_the_spec_and_invert_each_other(m, n):
    if m == n:
        reads = {j: {j} for j in range(n)}
    elif m > n:
        reads = {j: set(range(j * m // n, (j + 1) * m // n)) for j in range(n)}
    else:
        feeds = {i: set(range(i * n // m, (i + 1) * n // m)) for i in range(m)}
        reads = {j: {i for i in range(m) if j in feeds[i]} for j in range(n)}
    for j in range(n):
        assert set(pointwise_upstream(j, m, n)) == reads[j]
        assert reads[j], "every downstream partition reads something"
    for i in range(m):
        assert set(pointwise_downstream(i, m, n)) == {j for j in range(n) if i in reads[j]}
        assert len(pointwise_downstream(i, m, n)) >= 1, "every upstream partition feeds something"


# ---- hand-made graphs ---------------------------------------------------------------------


def test_figure_two_sources_into_one_task():
    # A -> C <- B, one task each; A finished.
    graph = [TriggerVertex(1, 1), TriggerVertex(2, 1), TriggerVertex(3, 1, ((1, PW), (2, A2A)))]
    assert _check(graph, {}) == [(1, 0), (2, 0)]
    assert _check(graph, {1: {0}}) == [(2, 0)]  # C still hears from B
    assert _check(graph, {1: {0}, 2: {0}}) == [(3, 0)]  # C is the new root


def test_a_finished_source_task_makes_its_pointwise_child_a_root():
    graph = [TriggerVertex(10, 2), TriggerVertex(11, 2, ((10, PW),))]
    _check(graph, {10: {0}}, [(10, 1), (11, 0)])


def test_one_running_upstream_task_blocks_every_all_to_all_child():
    graph = [TriggerVertex(0, 3), TriggerVertex(1, 2, ((0, A2A),))]
    _check(graph, {0: {0, 2}}, [(0, 1)])
    _check(graph, {0: {0, 1, 2}}, [(1, 0), (1, 1)])
    _check(graph, {0: {0, 1, 2}, 1: {1}}, [(1, 0)])


def test_pointwise_fan_in_reads_a_range():
    # m=4 > n=2: child 0 reads {0,1}, child 1 reads {2,3}
    graph = [TriggerVertex(0, 4), TriggerVertex(1, 2, ((0, PW),))]
    _check(graph, {0: {0, 1, 2}}, [(0, 3), (1, 0)])
    _check(graph, {0: {1, 2, 3}}, [(0, 0), (1, 1)])


def test_pointwise_fan_out_feeds_a_range():
    # m=2 < n=5: upstream 0 feeds {0,1}, upstream 1 feeds {2,3,4}
    graph = [TriggerVertex(0, 2), TriggerVertex(1, 5, ((0, PW),))]
    _check(graph, {0: {1}}, [(0, 0), (1, 2), (1, 3), (1, 4)])
    _check(graph, {0: {1}, 1: {3}}, [(0, 0), (1, 2), (1, 4)])


def test_several_inputs_intersect_their_candidates():
    # The appendix says "union"; a task needs every input edge clear, so it is the intersection.
    graph = [TriggerVertex(0, 2), TriggerVertex(1, 2), TriggerVertex(2, 2, ((0, PW), (1, PW)))]
    _check(graph, {0: {0}, 1: {1}}, [(0, 1), (1, 0)])  # a union would also return (2, 0), (2, 1)
    _check(graph, {0: {0}, 1: {0, 1}}, [(0, 1), (2, 0)])
    mixed = [TriggerVertex(0, 2), TriggerVertex(1, 3), TriggerVertex(2, 2, ((0, PW), (1, A2A)))]
    _check(mixed, {0: {0}, 1: {0, 1}}, [(0, 1), (1, 2)])
    _check(mixed, {0: {0}, 1: {0, 1, 2}}, [(0, 1), (2, 0)])


def test_a_blocked_running_task_still_blocks_its_children():
    # V1 runs but is no candidate (P1 runs); W1 reads V1, so it must not be triggered. Narrowing
    # children by the running tasks of V's *candidates* only (the appendix's split) would.
    graph = [TriggerVertex(0, 2), TriggerVertex(1, 2, ((0, PW),)), TriggerVertex(2, 2, ((1, PW),))]
    _check(graph, {0: {0}, 1: {0}}, [(0, 1), (2, 0)])


def test_predecessors_are_direct_upstream_tasks():
    # An arbitrary map may mark a task finished above a running one; its child then has no
    # running direct predecessor.
    chain = [TriggerVertex(0, 1), TriggerVertex(1, 1, ((0, PW),)), TriggerVertex(2, 1, ((1, PW),))]
    _check(chain, {1: {0}}, [(0, 0), (2, 0)])


def test_fully_finished_graph_has_no_roots_and_nothing_finished_gives_the_sources():
    graph = [
        TriggerVertex(5, 3),
        TriggerVertex(6, 2),
        TriggerVertex(7, 4, ((5, A2A), (6, PW))),
        TriggerVertex(8, 1, ((7, PW),)),
    ]
    all_done = {v.vertex_id: set(range(v.parallelism)) for v in graph}
    _check(graph, all_done, [])
    _check(graph, {}, [(5, 0), (5, 1), (5, 2), (6, 0), (6, 1)])
    _check(graph, {5: set(), 8: set()}, [(5, 0), (5, 1), (5, 2), (6, 0), (6, 1)])


def test_everything_running_costs_the_vertices_edges_and_source_tasks():
    sources = [TriggerVertex(i, 4) for i in range(10)]
    rest = [TriggerVertex(100 + k, 1000, ((k % 10, A2A if k % 2 else PW), (100 + k - 1, PW) if k else (k, PW)))
            for k in range(50)]
    graph = sources + rest
    work = [0]
    got = tasks_to_trigger(graph, {}, work=work)
    assert got == [(i, p) for i in range(10) for p in range(4)]
    vertices_and_edges = sum(1 + len(v.inputs) for v in graph)
    assert work[0] <= 3 * vertices_and_edges + 2 * 40  # no term in the 50 000 tasks of `rest`


@pytest.mark.parametrize(
    ("graph", "finished", "message"),
    [
        ([TriggerVertex(0, 0)], {}, "at least 1"),
        ([TriggerVertex(0, 1), TriggerVertex(1, 1, ((2, PW),))], {}, "not listed before it"),
        ([TriggerVertex(0, 1, ((0, PW),))], {}, "not listed before it"),
        ([TriggerVertex(0, 1), TriggerVertex(0, 2)], {}, "appears twice"),
        ([TriggerVertex(0, 1)], {3: {0}}, "not in the graph"),
        ([TriggerVertex(0, 2)], {0: {2}}, "partitions 0..1"),
    ],
)
def test_malformed_graphs_are_refused(graph, finished, message):
    with pytest.raises(ValueError, match=message):
        tasks_to_trigger(graph, finished)


# ---- random graphs ------------------------------------------------------------------------


def _random_dag(rng: random.Random, size: int, max_inputs: int = 3, max_parallelism: int = 8) -> list[TriggerVertex]:
    ids = rng.sample(range(10 * size + 10), size)  # arbitrary, non-contiguous ids
    vertices: list[TriggerVertex] = []
    for k, vertex_id in enumerate(ids):
        inputs = tuple(
            (vertices[rng.randrange(k)].vertex_id, rng.choice([A2A, PW, PW]))
            for _ in range(rng.randint(0, max_inputs) if k else 0)
        )
        vertices.append(TriggerVertex(vertex_id, rng.randint(1, max_parallelism), inputs))
    return vertices


def _random_finished(rng: random.Random, vertices: Sequence[TriggerVertex], p: float) -> dict[int, set[int]]:
    finished: dict[int, set[int]] = {}
    for v in vertices:
        style = rng.random()
        if style < 0.15:
            continue  # missing key
        if style < 0.3:
            finished[v.vertex_id] = set(range(v.parallelism))
        else:
            finished[v.vertex_id] = {j for j in range(v.parallelism) if rng.random() < p}
    return finished


def _closed_finished(rng: random.Random, vertices: Sequence[TriggerVertex], p: float) -> dict[int, set[int]]:
    """A task may finish only once all its predecessors have (as in a real job), with chance p."""
    by_id = {v.vertex_id: v for v in vertices}
    finished: dict[int, set[int]] = {}
    for v in vertices:
        done = set()
        for j in range(v.parallelism):
            ready = all(
                i in finished[u]
                for u, kind in v.inputs
                for i in _predecessors(j, by_id[u].parallelism, v.parallelism, kind)
            )
            if ready and rng.random() < p:
                done.add(j)
        finished[v.vertex_id] = done
    return finished


@pytest.mark.parametrize("seed", range(8))
def test_random_graphs_agree_with_the_definition(seed):
    rng = random.Random(seed)
    for _ in range(50):
        vertices = _random_dag(rng, rng.randint(1, 12))
        p = rng.choice([0.0, 0.2, 0.5, 0.8, 0.95, 1.0])
        finished = _closed_finished(rng, vertices, p) if rng.random() < 0.5 else _random_finished(rng, vertices, p)
        _check(vertices, finished)


def test_random_graphs_with_high_parallelism_and_fan_in_agree_with_the_definition():
    rng = random.Random(1234)
    for _ in range(60):
        vertices = _random_dag(rng, rng.randint(2, 8), max_inputs=6, max_parallelism=40)
        finished = _closed_finished(rng, vertices, rng.choice([0.5, 0.9, 0.99]))
        _check(vertices, finished)
        _check(vertices, _random_finished(rng, vertices, 0.5))


# ---- linear work --------------------------------------------------------------------------

WORK_BOUND = 4  # work <= WORK_BOUND * (V + E + tasks)


def _chain(rng: random.Random, size: int) -> list[TriggerVertex]:
    random_ = rng.random  # randrange and choice are slow at 100_000 vertices
    vertices = [TriggerVertex(0, 1 + int(4 * random_()))]
    for k in range(1, size):
        vertices.append(TriggerVertex(k, 1 + int(4 * random_()), ((k - 1, PW if random_() < 0.75 else A2A),)))
    return vertices


def _layered(rng: random.Random, size: int, width: int = 20) -> list[TriggerVertex]:
    """Layers of `width` vertices; each reads 1..3 vertices of the layer above (bounded degree)."""
    random_ = rng.random
    vertices: list[TriggerVertex] = []
    for k in range(size):
        layer_start = (k // width) * width
        picks = {layer_start - 1 - int(width * random_()) for _ in range(1 + int(3 * random_()))} if layer_start else ()
        inputs = tuple((u, PW if random_() < 0.8 else A2A) for u in sorted(picks))
        vertices.append(TriggerVertex(k, 1 + int(4 * random_()), inputs))
    return vertices


def _frontier_finished(rng: random.Random, vertices: Sequence[TriggerVertex]) -> dict[int, set[int]]:
    """Finished up to a ragged frontier, half the tasks of each vertex near it; the rest runs."""
    finished: dict[int, set[int]] = {}
    cut = len(vertices) // 2
    for k, v in enumerate(vertices):
        if k < cut - 50:
            finished[v.vertex_id] = set(range(v.parallelism))
        elif k < cut + 50:
            finished[v.vertex_id] = {j for j in range(v.parallelism) if rng.random() < 0.5}
        elif rng.random() < 0.3:
            finished[v.vertex_id] = {j for j in range(v.parallelism) if rng.random() < 0.5}
    return finished


def _half_finished(rng: random.Random, vertices: Sequence[TriggerVertex]) -> dict[int, set[int]]:
    """Every task finished by a coin toss: the most vertices partly finished, the worst case."""
    return {v.vertex_id: {j for j in range(v.parallelism) if rng.random() < 0.5} for v in vertices}


def _ratios(shape) -> dict[str, dict[int, float]]:
    """work / (V + E + tasks) per finished pattern and graph size."""
    ratios: dict[str, dict[int, float]] = {"frontier": {}, "half": {}}
    for size in (10, 100, 1_000, 10_000, 100_000):
        rng = random.Random(size)
        vertices = shape(rng, size)
        for pattern, make in (("frontier", _frontier_finished), ("half", _half_finished)):
            work = [0]
            tasks_to_trigger(vertices, make(rng, vertices), work=work)
            ratios[pattern][size] = work[0] / _size(vertices)
    return ratios


@pytest.mark.parametrize("shape", [_chain, _layered], ids=["chain", "layered"])
def test_work_is_linear_in_vertices_edges_and_tasks(shape):
    ratios = _ratios(shape)
    print(shape.__name__, {p: {size: round(r, 3) for size, r in by.items()} for p, by in ratios.items()})
    for by_size in ratios.values():
        assert all(r <= WORK_BOUND for r in by_size.values()), ratios
        assert by_size[100_000] <= 1.2 * by_size[1_000], ratios


def test_wide_all_to_all_fan_in_is_linear_where_the_definition_is_quadratic():
    sources = [TriggerVertex(k, 4) for k in range(300)]
    sink = TriggerVertex(1_000, 300, tuple((k, A2A) for k in range(300)))
    graph = [*sources, sink]
    finished = {k: {0, 1, 2, 3} for k in range(300)}
    bound = WORK_BOUND * _size(graph)
    work, brute_work = [0], [0]
    got = tasks_to_trigger(graph, finished, work=work)
    assert got == running_roots_brute_force(graph, finished, work=brute_work)
    assert got == [(1_000, j) for j in range(300)]
    assert work[0] <= bound
    assert brute_work[0] > 10 * bound  # 300 * 4 * 300 predecessor checks: a quadratic walk fails the bound


def test_wide_pointwise_fan_in_and_fan_out_stay_linear():
    rng = random.Random(7)
    # One vertex with 1_000 POINTWISE inputs, half their tasks finished.
    fan_in = [TriggerVertex(k, 4) for k in range(1_000)]
    fan_in.append(TriggerVertex(1_000, 4, tuple((k, PW) for k in range(1_000))))
    finished = {k: {j for j in range(4) if rng.random() < 0.9} for k in range(1_000)}
    work = [0]
    assert tasks_to_trigger(fan_in, finished, work=work) == running_roots_brute_force(fan_in, finished)
    assert work[0] <= WORK_BOUND * _size(fan_in)
    # One half-finished vertex of 1_000 tasks feeding 1_000 single-task POINTWISE children: each
    # child reads all 1_000 upstream tasks (10**6 task pairs); pulling keeps it at O(1) per child.
    fan_out = [TriggerVertex(0, 1_000)]
    fan_out += [TriggerVertex(k, 1, ((0, PW),)) for k in range(1, 1_001)]
    work, brute_work = [0], [0]
    finished = {0: set(range(0, 1_000, 2))}
    got = tasks_to_trigger(fan_out, finished, work=work)
    assert got == running_roots_brute_force(fan_out, finished, work=brute_work)
    assert got == [(0, j) for j in range(1, 1_000, 2)]
    assert work[0] <= WORK_BOUND * _size(fan_out)
    assert brute_work[0] > 20 * WORK_BOUND * _size(fan_out)
