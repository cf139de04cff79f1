"""CNN-to-CSDF conversion (Minakova & Stefanov, Algorithm 1): the paper's Fig. 1 / Table II
numbers exactly, balance on zoo models, SDF3 XML and DOT export, user errors."""
from __future__ import annotations

import functools
import xml.etree.ElementTree as ET

import pytest

import tightfit
from tightfit.analysis.csdf import (
    CSDFError,
    CSDFGraph,
    Channel,
    algorithm1_phases,
    buffer_sizes,
    check_balance,
    describe_order,
    firing_order,
    max_phases,
    paper_sequence,
    repetition_vector,
    split_rows,
    to_csdf,
    to_dot,
    to_sdf3_xml,
)
from tightfit.errors import OptionError


@functools.lru_cache(maxsize=None)
def model(name: str):
    return tightfit.load(name)


# The paper's Fig. 1 CNN: n1 = input source, n2..n4 = tightfit layers 0..2, n5 = output sink.
PAPER = {"in": "n1", "L0": "n2", "L1": "n3", "L2": "n4", "out": "n5"}

# Table II: (layer phases, source delivery, b12, b23, b34, b45, Total, Column 7).
TABLE_II = {
    "Ex1": ({}, None, (1024, 1024, 48, 2), 2098, "n11, n21, n31, n41, n51"),
    # Ex2: the prose says b12 = 24 * 32 * 1 = 786 bytes; that is a typo for 768, which the
    # table's b12 column and its Total (768 + 1024 + 48 + 2 = 1842) both confirm.
    "Ex2": ({0: 2}, [24, 8], (768, 1024, 48, 2), 1842, "n11, n21, n12, n22, n31, n41, n51"),
    # Ex3: Table II prints [n1(18-21), n2(2-16)], a typo: the prose (and 32 phases of n1) give
    # [n1(18-32), n2(2-16)], one n1 phase followed by one n2 phase.
    "Ex3": ({0: 16}, 32, (544, 1024, 48, 2), 1618,
            "n1(1-17), n21, [n1(18-32), n2(2-16)], n31, n41, n51"),
    "Ex4": ({0: 16, 1: 4}, 32, (544, 384, 48, 2), 978,
            "n1(1-17), n21, [n1(18-22), n2(2-6)], n31, [n1(23-25), n2(7-9)], n32, "
            "[n1(26-28), n2(10-12)], n33, [n1(29-32), n2(13-16)], n34, n41, n51"),
}

ZOO = ["resnet18", "mobilenet_v2", "googlenet", "squeezenet1_0", "densenet121"]


def paper_csdf(ex: str) -> CSDFGraph:
    phases, src, *_ = TABLE_II[ex]
    return to_csdf(model("minakova5"), phases, src)


# --- Fig. 1(b) and Section V-B --------------------------------------------------------------------

def test_fig1b_sequences_ex4():
    c = paper_csdf("Ex4")
    assert [a.name for a in c.actors] == ["in", "L0", "L1", "L2", "out"]
    assert [a.phases for a in c.actors] == [32, 16, 4, 1, 1]  # P3 = 4
    assert c.layer_actor(1).phases == 4
    # c12: n1 delivers one 32-wide row per phase; n2 reads 17 rows, then 1 new row per phase
    # (its 16 overlapping rows stay in c22).
    assert c.edge("in", "L0").production == (32,) * 32
    assert c.edge("in", "L0").consumption == (17 * 32,) + (32,) * 15
    assert c.self_loop("L0").production == (16 * 32,) * 15 + (0,)
    assert c.self_loop("L0").consumption == (0,) + (16 * 32,) * 15
    # c23: the paper's V23 : [1*384, 2*192, 1*256]. The first and last phases include the rows
    # cropped by pad3 = -1: v23(1) = (5 - (-1)) * 16 * 4 = 384, v23(4) = (3 - (-1)) * 16 * 4 = 256;
    # they are consumed from the FIFO and discarded by that phase (Alg. 1 lines 33, 42).
    c23 = c.edge("L0", "L1")
    assert c23.production == (64,) * 16
    assert c23.consumption == (384, 192, 192, 256)
    assert paper_sequence(c23.consumption) == "[1*384, 2*192, 1*256]"
    # c33: U33 : [3*128, 1*0], V33 : [1*0, 3*128] ((H_theta - s) * W * C = 2 * 16 * 4).
    c33 = c.self_loop("L1")
    assert c33.production == (128, 128, 128, 0)
    assert c33.consumption == (0, 128, 128, 128)
    assert c33.carries == c23.name
    # Table II Ex4, X3k: n3 accepts 6, 5, 5, 6 rows of 16 x 4 (new rows + the reused overlap).
    assert [(v + r) // 64 for v, r in zip(c23.consumption, c33.consumption)] == [6, 5, 5, 6]
    # c34: u34(p) = 1 * 4 * 3 = 12; n4 reads the whole 4 x 4 x 3.
    assert c.edge("L1", "L2").production == (12,) * 4
    assert c.edge("L1", "L2").consumption == (48,)
    assert c.edge("L2", "out").production == c.edge("L2", "out").consumption == (2,)
    # The paper's C = {c12, c22, c23, c33, c34, c45}.
    assert [ch.name for ch in c.channels] == ["c_in_L0", "c_L0_L0", "c_L0_L1", "c_L1_L1", "c_L1_L2", "c_L2_out"]


def test_algorithm1_default_phases():
    # Lines 9-12: P2 = 16 (overlap, s = 1 < 17), P3 = (16 + (-2) - max(5, 3)) / 3 + 1 = 4,
    # P4 = 1 (the 4 x 4 window covers the whole 4 x 4 input).
    assert algorithm1_phases(model("minakova5")) == {0: 16, 1: 4, 2: 1}
    assert max_phases(model("minakova5")) == {0: 16, 1: 4}


def test_padding_consumption_matches_algorithm1():
    """A 3x3, stride 1, pad 1 conv with one row per phase: v(1) = (H_theta - pad[1]) rows = 2
    (the padding row is not data), then s = 1 row, and at the last phase (s - pad[3]) = 0 rows
    (Alg. 1 lines 33, 42); the self-loop holds H_theta - s = 2 rows."""
    g = model("resnet18")
    layer = g.layers[2]
    assert layer.attrs["kernel"] == (3, 3) and layer.attrs["pads"] == (1, 1, 1, 1)
    c = to_csdf(g, {2: 56})
    row = 56 * 64
    edge = c.edge("L1", "L2")
    assert edge.consumption == (2 * row,) + (row,) * 54 + (0,)
    assert c.self_loop("L2").production == (2 * row,) * 55 + (0,)
    # Stride 2 with padding (the 3x3/2 max pool, 112 rows in, 56 out): v(1) = 2 rows, then 2.
    c = to_csdf(g, {1: 56})
    v = c.edge("L0", "L1").consumption
    assert v[0] == 2 * 112 * 64 and set(v[1:]) == {2 * 112 * 64} and sum(v) == 112 * 112 * 64
    check_balance(c)


# --- Table II ------------------------------------------------------------------------------------

@pytest.mark.parametrize("ex", list(TABLE_II))
def test_table2_buffers_and_order(ex):
    _, _, per_edge, total, column7 = TABLE_II[ex]
    c = paper_csdf(ex)
    assert check_balance(c) == {a.name: 1 for a in c.actors}
    order = firing_order(c)
    assert describe_order(c, order, PAPER) == column7
    sizes = buffer_sizes(c, order)
    assert tuple(sizes[c.edge(a, b).name] for a, b in [("in", "L0"), ("L0", "L1"), ("L1", "L2"), ("L2", "out")]) == per_edge
    assert sum(sizes.values()) == total
    assert len(order) == sum(a.phases for a in c.actors)  # 5, 7, 51, 54 computational steps


def test_ex2_by_hand_order_and_layer_by_layer():
    c = paper_csdf("Ex2")
    by_hand = [("in", 1), ("L0", 1), ("in", 2), ("L0", 2), ("L1", 1), ("L2", 1), ("out", 1)]
    assert firing_order(c) == by_hand
    assert sum(buffer_sizes(c, by_hand).values()) == 1842
    # With Ex4's phases but run layer by layer (all phases of n1, then of n2, ...) the buffers
    # are whole tensors again: phases alone do not reduce memory, their order does.
    c = paper_csdf("Ex4")
    naive = [(a.name, p) for a in c.actors for p in range(1, a.phases + 1)]
    assert sum(buffer_sizes(c, naive).values()) == 2098


def test_explicit_rows_and_split():
    g = model("minakova5")
    assert to_csdf(g, {0: [8, 8]}, [24, 8]).channels == paper_csdf("Ex2").channels
    assert to_csdf(g, {"/n2/Conv": 2}).layer_actor(0).rows_per_phase == (8, 8)
    assert split_rows(16, 6) == (3, 3, 3, 3, 3, 1)
    assert split_rows(10, 6) == (2, 2, 2, 2, 1, 1)
    assert split_rows(32, 32) == (1,) * 32
    c = to_csdf(g, {0: [5, 11], 1: 3}, [20, 12])
    check_balance(c)
    assert c.layer_actor(1).rows_per_phase == (2, 1, 1)
    assert sum(buffer_sizes(c, firing_order(c)).values()) > 0


def test_tokens_scale_with_itemsize():
    c = to_csdf(model("minakova5"), {0: 16, 1: 4}, 32, itemsize=4)
    assert c.edge("L0", "L1").consumption == (4 * 384, 4 * 192, 4 * 192, 4 * 256)
    assert sum(buffer_sizes(c, firing_order(c)).values()) == 4 * 978


# --- balance and export on zoo models ---------------------------------------------------------------

def _check_exports(g, c: CSDFGraph) -> None:
    q = check_balance(c)
    assert set(q.values()) == {1}
    # Each edge carries exactly its tensor over one iteration.
    for ch in c.edges:
        size = g.tensors[ch.tensor].per_sample * g.shape(ch.tensor)[0]
        assert sum(ch.production) == sum(ch.consumption) == size, ch.name
    root = ET.fromstring(to_sdf3_xml(c))
    assert root.tag == "sdf3" and root.get("type") == "csdf"
    csdf = root.find("applicationGraph/csdf")
    actors = {a.get("name"): a for a in csdf.findall("actor")}
    assert len(actors) == len(g.layers) + len(g.inputs) + len(g.outputs)
    assert sum(a.get("type") not in ("input", "output") for a in actors.values()) == len(g.layers)
    xml_channels = csdf.findall("channel")
    assert len(xml_channels) == len(c.channels)
    for xc in xml_channels:
        ch = c.channel(xc.get("name"))
        assert xc.get("initialTokens") == "0"
        for end, seq in (("src", ch.production), ("dst", ch.consumption)):
            port = next(p for p in actors[xc.get(f"{end}Actor")].findall("port") if p.get("name") == xc.get(f"{end}Port"))
            assert port.get("type") == ("out" if end == "src" else "in")
            assert [int(x) for x in port.get("rate").split(",")] == list(seq)
    props = root.findall("applicationGraph/csdfProperties/actorProperties")
    assert {p.get("actor") for p in props} == set(actors)
    for p in props:
        times = p.find("processor/executionTime").get("time").split(",")
        assert len(times) == c.actor(p.get("actor")).phases
    dot = to_dot(c)
    assert dot.startswith("digraph") and all(f"{ch.name}\\n" in dot for ch in c.channels)


@pytest.mark.parametrize("ex", list(TABLE_II))
def test_balance_and_export_minakova5(ex):
    _check_exports(model("minakova5"), paper_csdf(ex))


@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("mode", ["one", "max"])
def test_balance_and_export_zoo(name, mode):
    g = model(name)
    if mode == "one":
        c = to_csdf(g)
        assert all(a.phases == 1 for a in c.actors) and not c.self_loops
    else:
        c = to_csdf(g, max_phases(g), g.shape(g.inputs[0])[2])
        assert c.self_loops
    _check_exports(g, c)
    # Per-edge model: a tensor read by k layers is k channels; one channel per input of a join.
    for layer in g.layers:
        for t in set(layer.inputs):
            assert c.edge(c.actors[0].name if t in g.inputs else f"L{g.producer(t).id}", f"L{layer.id}").tensor == t
    order = firing_order(c)
    assert len(order) == sum(a.phases for a in c.actors)
    sizes = buffer_sizes(c, order)
    if mode == "one":  # every buffer holds its whole tensor
        assert all(sizes[ch.name] == sum(ch.production) for ch in c.edges)


def test_max_phases_shrink_buffers():
    g = model("resnet18")
    one, many = to_csdf(g), to_csdf(g, max_phases(g), 224)
    assert sum(buffer_sizes(many, firing_order(many)).values()) < sum(buffer_sizes(one, firing_order(one)).values()) / 5


def test_check_balance_rejects_mutants():
    c = paper_csdf("Ex4")
    chans = list(c.channels)
    i = next(k for k, ch in enumerate(chans) if ch.name == "c_L0_L1")
    ch = chans[i]
    bad = Channel(ch.name, ch.src, ch.dst, ch.production, (320,) + ch.consumption[1:], 0, ch.tensor)
    with pytest.raises(CSDFError):
        check_balance(CSDFGraph(c.name, c.actors, tuple(chans[:i] + [bad] + chans[i + 1:]), c.tensor_tokens))
    j = next(k for k, ch in enumerate(chans) if ch.name == "c_L1_L1")
    loop = chans[j]
    bad = Channel(loop.name, loop.src, loop.dst, loop.production, (0, 128, 128, 0), 0, None, loop.carries)
    with pytest.raises(CSDFError):
        check_balance(CSDFGraph(c.name, c.actors, tuple(chans[:j] + [bad] + chans[j + 1:]), c.tensor_tokens))
    # Rates that balance only with q = (2, 1): a consistent graph, but not one inference.
    doubled = [Channel(x.name, x.src, x.dst, tuple(2 * u for u in x.production), x.consumption, 0, None)
               if x.name == "c_in_L0" else x for x in chans]
    g2 = CSDFGraph(c.name, c.actors, tuple(doubled), {})
    assert repetition_vector(g2)["in"] * 2 == repetition_vector(g2)["L0"]
    with pytest.raises(CSDFError, match="not all ones"):
        check_balance(g2)


# --- user errors ----------------------------------------------------------------------------------

def test_errors_name_the_layer():
    g = model("minakova5")
    with pytest.raises(OptionError, match=r"layer 1 \(/n3/Conv, conv\) has 4 output rows; cannot run it in 5 phases"):
        to_csdf(g, {1: 5})
    with pytest.raises(OptionError, match="no layer 7"):
        to_csdf(g, {7: 2})
    with pytest.raises(OptionError, match="no layer 'nope'"):
        to_csdf(g, {"nope": 2})
    with pytest.raises(OptionError, match=r"layer 0 .* sum to its 16 rows"):
        to_csdf(g, {0: [8, 7]})
    with pytest.raises(OptionError, match="at least 1 phase"):
        to_csdf(g, {0: 0})
    with pytest.raises(OptionError, match="given phases twice"):
        to_csdf(g, {0: 2, "/n2/Conv": 4})
    with pytest.raises(OptionError, match="input 'input'"):
        to_csdf(g, {}, [24, 7])
    with pytest.raises(OptionError, match="input 'input' has 32 output rows"):
        to_csdf(g, {}, 33)
    r = model("resnet18")
    with pytest.raises(OptionError, match=r"layer 30 \(/fc/Gemm, gemm\) needs its whole input"):
        to_csdf(r, {30: 2})
    to_csdf(r, {30: 1, "/avgpool/GlobalAveragePool": 1})  # one phase is always allowed


def test_squeeze_excitation_product_has_one_phase():
    g = model("efficientnet_b0")
    mul = next(layer for layer in g.layers if layer.op == "mul")
    assert mul.id not in max_phases(g)
    with pytest.raises(OptionError, match=f"layer {mul.id} .* needs its whole input"):
        to_csdf(g, {mul.id: 2})


def test_bad_firing_orders():
    c = paper_csdf("Ex2")
    good = firing_order(c)
    with pytest.raises(OptionError, match="out of order"):
        buffer_sizes(c, [("in", 2)] + good)
    with pytest.raises(OptionError, match="needs 768 tokens"):
        buffer_sizes(c, [("L0", 1)] + good)
    with pytest.raises(OptionError, match="not one iteration"):
        buffer_sizes(c, good[:-1])
    with pytest.raises(OptionError, match="not .actor, phase."):
        buffer_sizes(c, [("n9", 1)])


@pytest.mark.parametrize("ex", list(TABLE_II))
def test_summary_prints_total_and_arena_with_reuse(ex, capsys):
    """`tightfit csdf --format summary` prints Table II's Total, then the arena of the parts plan
    of the same phases with buffers shared by lifetime (1 byte per element): at least the plan's
    lower bound and never above its buffers summed, up to the 64-byte alignment of offsets."""
    import re

    from tightfit.cli import main

    phases, src, _, total, _ = TABLE_II[ex]
    argv = ["csdf", "minakova5", "--format", "summary", "--phases", ",".join(f"{k}={v}" for k, v in phases.items())]
    if isinstance(src, list):
        argv += ["--source-rows", ",".join(map(str, src))]
    elif src:
        argv += ["--source-phases", str(src)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(rf"total \(no reuse\)\s+{total} B", out)
    arena, no_reuse, bound = map(int, re.search(r"arena with reuse .*: (\d+) B; buffers without reuse (\d+) B; "
                                                r"lower bound (\d+) B", out).groups())
    assert bound <= arena <= no_reuse + 64 * 4 and no_reuse <= total
