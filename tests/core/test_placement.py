"""The placement planner: prepulls never past a node's disk, spread over the nodes,
placement where the image is."""

from __future__ import annotations

from rollbox.placement import NodeImages, PlacementPlanner

GB = 10**9


def test_prepulls_go_where_they_fit_and_spread() -> None:
    nodes = [NodeImages("a", 10 * GB), NodeImages("b", 10 * GB, present={"old": 6 * GB},
                                                      in_use={"old"})]
    upcoming = [(f"i{n}", 2 * GB) for n in range(6)]
    planned = PlacementPlanner(window=6, max_in_flight=10).prepulls(upcoming, nodes)
    per_node: dict[str, int] = {}
    for p in planned:
        per_node[p.node] = per_node.get(p.node, 0) + p.size
    # a holds 8.5 GB under the GC threshold (4 images), b 2.5 GB beside its image in use
    assert per_node["a"] <= 8.5 * GB and per_node["b"] <= 2.5 * GB
    assert per_node == {"a": 8 * GB, "b": 2 * GB}
    assert [p.image for p in planned] == ["i0", "i1", "i2", "i3", "i4"]  # soonest first


def test_what_gc_may_delete_is_room_but_what_is_wanted_soon_is_not() -> None:
    node = NodeImages("a", 10 * GB, present={"stale": 8 * GB, "soon": 0})
    planner = PlacementPlanner(window=4)
    assert planner.prepulls([("new", 4 * GB)], [node])  # "stale" is neither used nor wanted
    full = NodeImages("a", 10 * GB, present={"soon": 8 * GB})
    assert planner.prepulls([("soon", 8 * GB), ("new", 4 * GB)], [full]) == []


def test_nothing_is_prepulled_twice_or_beyond_the_window() -> None:
    nodes = [NodeImages("a", 100 * GB, pulling={"x": GB}), NodeImages("b", 100 * GB)]
    planned = PlacementPlanner(window=2).prepulls(
        [("x", GB), ("y", GB), ("y", GB), ("z", GB)], nodes)
    assert [p.image for p in planned] == ["y"]
    assert planned[0].node == "b"  # a is busy pulling x


def test_placement_follows_the_image_and_the_free_slots() -> None:
    planner = PlacementPlanner()
    nodes = [NodeImages("a", GB, present={"x": 1}, free_slots=0),
             NodeImages("b", GB, pulling={"x": 1}, free_slots=3),
             NodeImages("c", GB, present={"x": 1}, free_slots=1),
             NodeImages("d", GB, free_slots=9)]
    assert planner.place("x", nodes) == "c"  # present beats pulling; a has no slot
    assert planner.place("y", nodes) == "d"  # nobody has y: the least to pull, then slots
    assert planner.place("y", [NodeImages("e", GB, free_slots=0)]) is None
