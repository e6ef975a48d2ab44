"""hrope.shapes: named dims bound across tensors, literal sizes, ``...``, the order of the checks,
each kind's default message and a call site's own templates, and check_finite."""

from __future__ import annotations

import doctest
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hrope.shapes
from hrope.errors import EncodingError, InputError
from hrope.shapes import MESSAGES, check_finite, check_shapes


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor with a shape and no data: the checks never read values."""
    return torch.empty(shape, dtype=dtype, device="meta")


def message(call) -> str:
    with pytest.raises(InputError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text
    return text


def test_the_module_examples_run():
    assert doctest.testmod(hrope.shapes).failed == 0


def test_names_bind_across_tensors_and_the_sizes_come_back():
    q, k = meta(2, 8, 5, 16), meta(2, 2, 7, 16)
    sizes = check_shapes({"q": (q, "B heads L D"), "k": (k, "B heads_kv T D")}, dims={"extra": 3})
    assert sizes == {"extra": 3, "B": 2, "heads": 8, "L": 5, "D": 16, "heads_kv": 2, "T": 7}
    assert check_shapes({}) == {}


def test_a_name_that_disagrees_names_both_tensors_and_the_dims_they_share():
    q, k = meta(2, 8, 5, 16), meta(2, 8, 5, 12)
    assert message(lambda: check_shapes({"q": (q, "B H N D"), "k": (k, "B H M D")})) == (
        "q has (B, H, D) = (2, 8, 16) but k has (2, 8, 12)"
    )
    x, y = meta(2, 3), meta(4)
    assert message(lambda: check_shapes({"x": (x, "B C"), "y": (y, "B")})) == "x has B = 2 but y has 4"
    # the argument that bound the name first is the one named, also when a third one disagrees
    z = meta(3, 3)
    assert message(lambda: check_shapes({"x": (x, "B C"), "y": (x, "B C"), "z": (z, "B C")})) == (
        "x has (B, C) = (2, 3) but z has (3, 3)"
    )


def test_literal_sizes_given_sizes_and_names_used_twice_in_one_pattern():
    E = meta(2, 3, 4, 4)
    assert check_shapes({"E": (E, "B V 4 4")}) == {"B": 2, "V": 3}
    assert message(lambda: check_shapes({"E": (meta(2, 3, 3, 4), "B V 4 4")})) == (
        "E must have shape (B, V, 4, 4), got (2, 3, 3, 4)"
    )
    # a size given in dims is part of the expected shape; a name used twice within a pattern must agree
    assert message(lambda: check_shapes({"E": (E, "B V 4 4")}, dims={"B": 1})) == (
        "E must have shape (1, V, 4, 4), got (2, 3, 4, 4)"
    )
    assert check_shapes({"M": (meta(5, 5), "N N")}) == {"N": 5}
    assert message(lambda: check_shapes({"M": (meta(5, 4), "N N")})) == "M must have shape (N, N), got (5, 4)"


def test_the_ellipsis_stands_for_any_number_of_dims():
    for shape in [(4, 4), (2, 4, 4), (2, 3, 5, 4, 4)]:
        assert check_shapes({"G": (meta(*shape), "... 4 4")}) == {}
    assert check_shapes({"x": (meta(2, 7, 9, 3), "B ... C")}) == {"B": 2, "C": 3}
    assert check_shapes({"x": (meta(2, 3), "B ... C")}) == {"B": 2, "C": 3}
    assert check_shapes({"mask": (meta(5), "... T")}, dims={"T": 5}) == {"T": 5}
    assert message(lambda: check_shapes({"G": (meta(4), "... 4 4")})) == "G must have shape (..., 4, 4), got (4,)"
    assert message(lambda: check_shapes({"mask": (meta(2, 4), "... T")}, dims={"T": 5})) == (
        "mask must have shape (..., 5), got (2, 4)"
    )


def test_rank_errors_render_the_pattern_as_a_shape():
    assert message(lambda: check_shapes({"m": (meta(2, 8), "B N 3")}, dims={"B": 2})) == (
        "m must have shape (2, N, 3), got (2, 8)"
    )
    assert message(lambda: check_shapes({"v": (meta(3, 1), "3")})) == "v must have shape (3,), got (3, 1)"
    assert message(lambda: check_shapes({"s": (meta(3), "")})) == "s must have shape (), got (3,)"


def test_a_non_tensor_is_named_with_its_type():
    assert message(lambda: check_shapes({"depth": (0.5, "B N")}, dims={"B": 1, "N": 8})) == (
        "depth must be a tensor of shape (1, 8), got float"
    )


def test_device_and_dtype_checks_and_their_order():
    cpu, on_meta = torch.zeros(2, 3), meta(2, 3)
    assert message(lambda: check_shapes({"x": (on_meta, "B C")}, device=torch.device("cpu"))) == (
        "x is on meta but must be on cpu"
    )
    assert message(lambda: check_shapes({"a": (cpu, "B C"), "b": (on_meta, "B C")}, same_device=True)) == (
        "a is on cpu but b is on meta; put them on one device"
    )
    integer = torch.zeros(2, 3, dtype=torch.int64)
    assert message(lambda: check_shapes({"x": (integer, "B C")}, floating=True)) == (
        "x must be a floating-point tensor, got torch.int64"
    )
    assert message(lambda: check_shapes({"a": (cpu, "B C"), "b": (cpu.double(), "B C")}, same_dtype=True)) == (
        "a is torch.float32 but b is torch.float64; give them one dtype"
    )
    # shapes first, then devices, then dtypes; nothing is checked that was not asked for
    wrong_everything = torch.empty(5, dtype=torch.int64, device="meta")
    spec = {"x": (wrong_everything, "B C")}
    assert "must have shape" in message(lambda: check_shapes(spec, device=torch.device("cpu"), floating=True))
    spec = {"x": (torch.empty(2, 3, dtype=torch.int64, device="meta"), "B C")}
    assert "is on meta" in message(lambda: check_shapes(spec, device=torch.device("cpu"), floating=True))
    assert check_shapes({"a": (integer, "B C"), "b": (on_meta, "B C")}) == {"B": 2, "C": 3}


def test_a_call_site_gives_its_own_templates_and_error_class():
    q, k = meta(1, 2, 8, 16), meta(1, 2, 6, 16)
    one = "q, k must agree; got {shapes[q]}, {shapes[k]} ({dims})"
    with pytest.raises(EncodingError, match=r"^q, k must agree; got \(1, 2, 8, 16\), \(1, 2, 6, 16\) \(\{'B': 1, "):
        check_shapes({"q": (q, "B H N D"), "k": (k, "B H N D")}, error=EncodingError, messages=one)
    by_kind = {"shape": "bad {name}: {expected} vs {shape}"}
    assert message(lambda: check_shapes({"q": (q[0], "B H N D")}, messages=by_kind)) == (
        "bad q: (B, H, N, D) vs (2, 8, 16)"
    )
    # kinds the mapping leaves out keep the defaults
    assert message(lambda: check_shapes({"q": ("q", "B H N D")}, messages=by_kind)) == (
        MESSAGES["type"].format(name="q", expected="(B, H, N, D)", shape="str")
    )
    place = "{dtypes[a]} on {devices[a]} vs {dtypes[b]} on {devices[b]}"
    spec = {"a": (torch.zeros(2), "N"), "b": (meta(2), "N")}
    assert message(lambda: check_shapes(spec, same_device=True, messages={"same_device": place})) == (
        "torch.float32 on cpu vs torch.float32 on meta"
    )


@pytest.mark.parametrize("pattern", ["B ... N ...", "B -1", "B a-b", "B 2.5"])
def test_a_malformed_pattern_is_a_value_error(pattern):
    with pytest.raises(ValueError, match="shape pattern") as info:
        check_shapes({"x": (meta(2, 3), pattern)})
    assert not isinstance(info.value, InputError)  # a bug at the call site, not bad input


def test_check_finite_names_the_tensor_and_steps_aside_while_compiling():
    good, bad = torch.ones(3), torch.tensor([1.0, float("inf"), 0.0])
    check_finite({"a": good, "b": good.double()})
    assert message(lambda: check_finite({"a": good, "b": bad})) == "b must be finite (found NaN or inf)"
    with pytest.raises(EncodingError, match=r"^b must be finite in torch\.float32$"):
        check_finite({"b": bad}, error=EncodingError, message="{name} must be finite in {dtype}")
    with mock.patch("torch.compiler.is_compiling", return_value=True):
        check_finite({"b": bad})


# --------------------------------------------------------------------------- property
@st.composite
def tensors_and_patterns(draw):
    """1-3 tensors with patterns over a few shared names and literals, some with a ``...``; the
    sizes of the names; the dims given up front; the (tensor, position) of every dim whose size is
    pinned (a literal, a given name, or a name used more than once)."""
    sizes = draw(st.dictionaries(st.sampled_from("abcd"), st.integers(1, 4), min_size=1))
    names = sorted(sizes)
    specs = []
    for _ in range(draw(st.integers(1, 3))):
        dims = draw(st.lists(st.one_of(st.sampled_from(names), st.integers(1, 4)), max_size=4))
        cut = draw(st.none() | st.integers(0, len(dims)))
        extra = draw(st.lists(st.integers(0, 3), max_size=2)) if cut is not None else []
        tokens = [str(d) for d in dims]
        shape = [sizes[d] if isinstance(d, str) else d for d in dims]
        if cut is not None:
            tokens.insert(cut, "...")
            shape[cut:cut] = extra
        specs.append((tokens, shape, cut, len(extra)))
    given_dims = {n: sizes[n] for n in draw(st.lists(st.sampled_from(names), unique=True))}
    uses = [t for tokens, *_ in specs for t in tokens]
    pinned = []
    for i, (tokens, _, cut, covered) in enumerate(specs):
        for j, token in enumerate(t for t in tokens if t != "..."):
            if token.isdigit() or token in given_dims or uses.count(token) > 1:
                pinned.append((i, j if cut is None or j < cut else j + covered))
    return sizes, specs, given_dims, pinned


@settings(max_examples=200, deadline=None)
@given(tensors_and_patterns(), st.data())
def test_every_fitting_shape_passes_and_every_changed_pinned_dim_fails(case, data):
    sizes, specs, given_dims, pinned = case
    spec = {f"x{i}": (meta(*shape), " ".join(tokens)) for i, (tokens, shape, *_) in enumerate(specs)}
    used = {t for tokens, *_ in specs for t in tokens if t in sizes}
    assert check_shapes(spec, dims=given_dims) == {n: sizes[n] for n in used | set(given_dims)}
    if pinned:
        i, position = data.draw(st.sampled_from(pinned))
        tokens, shape, *_ = specs[i]
        changed = list(shape)
        changed[position] += 1
        spec[f"x{i}"] = (meta(*changed), " ".join(tokens))
        with pytest.raises(InputError):
            check_shapes(spec, dims=given_dims)
