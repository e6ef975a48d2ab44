"""Declarative checks of tensor arguments: shapes with named dims, dtype, device, finite values.

:func:`check_shapes` takes the tensor arguments of a call, each with a pattern of its dims
separated by spaces:

- a name (``B``, ``heads``, ``head_dim``) stands for the size it first meets: every other use of
  the name, in the same tensor or another one of the call, must have that size (``dims`` gives
  sizes known beforehand);
- an integer is that size;
- ``...`` (at most once) stands for any number of dims, e.g. ``"... 4 4"``, a batch of 4x4 matrices.

It reads shapes, dtypes and devices only (no data pass, no device sync, nothing that breaks a
``torch.compile`` graph); :func:`check_finite` reads the values. A failure raises ``error`` (an
:class:`~hrope.errors.InputError`) with a one-line message: its kind's default in
:data:`MESSAGES`, which names the argument, or the call site's own template.

```pycon
>>> import torch
>>> from hrope.shapes import check_shapes
>>> q, k = torch.zeros(2, 8, 16, 64), torch.zeros(2, 2, 16, 64)
>>> check_shapes({"q": (q, "B heads N D"), "k": (k, "B heads_kv N D")})
{'B': 2, 'heads': 8, 'N': 16, 'D': 64, 'heads_kv': 2}
>>> check_shapes({"q": (q, "B heads N D"), "k": (k[..., :32], "B heads_kv N D")})
Traceback (most recent call last):
    ...
hrope.errors.InputError: q has (B, N, D) = (2, 16, 64) but k has (2, 16, 32)
>>> check_shapes({"m": (torch.zeros(2, 8), "B N 3")}, dims={"B": 2})
Traceback (most recent call last):
    ...
hrope.errors.InputError: m must have shape (2, N, 3), got (2, 8)

```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, cast

import torch
from torch import Tensor

from .errors import InputError, checking_values

__all__ = ["check_shapes", "check_finite", "check_rotations", "MESSAGES"]

# The default message of each kind of failure, a str.format template (fields: check_shapes' doc)
MESSAGES: dict[str, str] = {
    "type": "{name} must be a tensor of shape {expected}, got {shape}",
    "shape": "{name} must have shape {expected}, got {shape}",
    "dims": "{other} has {names} = {bound} but {name} has {got}",
    "device": "{name} is on {device} but must be on {expected}",
    "same_device": "{other} is on {expected} but {name} is on {device}; put them on one device",
    "floating": "{name} must be a floating-point tensor, got {dtype}",
    "same_dtype": "{other} is {expected} but {name} is {dtype}; give them one dtype",
    "finite": "{name} must be finite (found NaN or inf)",
}


def check_shapes(
    tensors: Mapping[str, tuple[object, str]],
    *,
    error: type[InputError] = InputError,
    dims: Mapping[str, int] | None = None,
    device: torch.device | None = None,
    same_device: bool = False,
    floating: bool = False,
    same_dtype: bool = False,
    messages: str | Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Check ``tensors`` (argument name -> ``(tensor, pattern)``) and return the size of every named dim.

    The checks, in this order, each with its kind of failure: argument by argument, ``type`` and
    ``shape`` (a tensor whose dims fit its pattern: rank, literal sizes, the sizes in ``dims``, a
    name used twice in it), then ``dims`` (the names it shares with the arguments before it have
    their sizes); ``device`` (each tensor on ``device``, if given) and ``same_device`` (all on the
    first one's device, if True); ``floating`` (each a floating-point tensor, if True) and
    ``same_dtype`` (all of the first one's dtype, if True).

    Args:
        tensors: the arguments in the order they are checked, each with its pattern (module doc).
        error: the :class:`~hrope.errors.InputError` subclass raised.
        dims: sizes known beforehand, e.g. ``{"B": cameras.batch_size}``.
        messages: one template for every kind, or templates by kind (:data:`MESSAGES` for the
            others), with the ``str.format`` fields ``name``, ``shape`` (a tuple, or the type name
            of a non-tensor), ``dtype``, ``device`` of the failing argument; ``expected`` (``type``,
            ``shape``: the pattern with the sizes of ``dims``; ``device``: that device; ``same_*``:
            the first tensor's device or dtype); ``other`` (``dims``, ``same_*``: the argument it
            disagrees with); ``names``, ``bound``, ``got`` (``dims``: the names the two share, their
            sizes in ``other`` and in ``name``); ``dims`` (the sizes bound so far); ``shapes``,
            ``dtypes``, ``devices`` (of every argument, by name).

    Returns ``dims`` and the sizes bound by the tensors; raises ``error`` (ValueError for a malformed pattern).
    """
    given = dims or {}

    def fail(kind: str, name: str, known: Mapping[str, int], **fields: Any) -> NoReturn:
        template = messages if isinstance(messages, str) else (messages or {}).get(kind, MESSAGES[kind])
        raise error(_format(template, tensors, name, known, fields))

    checked: dict[str, Tensor] = {}
    named: dict[str, dict[str, int]] = {}  # each argument's named dims (those of dims left out)
    known = dict(given)  # the size of each name
    owner: dict[str, str] = {}  # the argument that bound it
    for name, (x, pattern) in tensors.items():
        tokens = pattern.split()
        sizes = _named_sizes(tokens, x.shape, given) if isinstance(x, Tensor) else None
        if sizes is None:
            fail("shape" if isinstance(x, Tensor) else "type", name, given, expected=_render(tokens, given))
        checked[name], named[name] = cast(Tensor, x), sizes
        for dim, size in sizes.items():
            if known.setdefault(dim, size) != size:
                fail("dims", name, known, **_disagreement(named, name, owner[dim]))
            owner.setdefault(dim, name)
    failure = _placement(checked, device, same_device, floating, same_dtype)
    if failure is not None:
        kind, name, fields = failure
        fail(kind, name, known, **fields)
    return known


def check_finite(
    tensors: Mapping[str, Tensor], *, error: type[InputError] = InputError, message: str = MESSAGES["finite"]
) -> None:
    """Each of ``tensors`` (argument name -> tensor of any shape) is finite, else ``error`` with
    ``message`` (``str.format`` fields ``name`` and ``dtype`` of the first non-finite one). Reads
    the values (one device sync per tensor); skipped while ``torch.compile`` traces
    (:func:`hrope.errors.checking_values`).

    ```pycon
    >>> check_finite({"depth": torch.tensor([1.0, float("nan")])})
    Traceback (most recent call last):
        ...
    hrope.errors.InputError: depth must be finite (found NaN or inf)

    ```
    """
    if not checking_values():
        return
    for name, x in tensors.items():
        if not torch.isfinite(x).all():
            raise error(message.format(name=name, dtype=x.dtype))


def _placement(
    checked: Mapping[str, Tensor], device: torch.device | None, same_device: bool, floating: bool, same_dtype: bool
) -> tuple[str, str, dict[str, Any]] | None:
    """The first failure of the device and dtype checks of :func:`check_shapes`: (kind, argument,
    its fields), or None."""
    first = next(iter(checked), "")  # the argument same_device and same_dtype compare with
    for name, x in checked.items():
        if device is not None and x.device != device:
            return "device", name, {"expected": device}
        if same_device and x.device != checked[first].device:
            return "same_device", name, {"other": first, "expected": checked[first].device}
    for name, x in checked.items():
        if floating and not x.is_floating_point():
            return "floating", name, {}
        if same_dtype and x.dtype != checked[first].dtype:
            return "same_dtype", name, {"other": first, "expected": checked[first].dtype}
    return None


def _name(token: str) -> str:
    """``token``, the name of a dim (ValueError for anything else, e.g. ``-1`` or ``a-b``)."""
    if not token.isidentifier():
        raise ValueError(f"shape pattern: {token!r} is not a name, an integer or the one '...'")
    return token


def _named_sizes(tokens: list[str], shape: Sequence[int], given: Mapping[str, int]) -> dict[str, int] | None:
    """Name -> size of the named dims of ``shape`` under ``tokens`` (those of ``given`` left out);
    None where the rank, a literal size, a size of ``given`` or a name used twice does not fit."""
    if "..." in tokens:
        cut = tokens.index("...")
        covered = len(shape) - len(tokens) + 1  # the number of dims "..." stands for
        if covered < 0:
            return None
        tokens, shape = tokens[:cut] + tokens[cut + 1 :], [*shape[:cut], *shape[cut + covered :]]
    elif len(shape) != len(tokens):
        return None
    sizes: dict[str, int] = {}
    for token, size in zip(tokens, shape):
        if token in given:
            if given[token] != size:
                return None
        elif token.isdigit():
            if int(token) != size:
                return None
        elif sizes.setdefault(_name(token), size) != size:  # a second "..." fails _name
            return None
    return sizes


def _render(tokens: list[str], sizes: Mapping[str, int]) -> str:
    """A pattern as a shape tuple, with the sizes known in ``sizes``: ``(2, N, 3)`` (ValueError for
    a malformed pattern)."""
    if tokens.count("...") > 1:
        raise ValueError(f"shape pattern {' '.join(tokens)!r} has more than one '...'")
    parts = [t if t.isdigit() or t == "..." else str(sizes.get(_name(t), t)) for t in tokens]
    return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"


def _disagreement(named: Mapping[str, dict[str, int]], name: str, other: str) -> dict[str, str]:
    """The ``dims`` fields: ``other``, the names it shares with ``name``, and their sizes in each."""
    mine, theirs = named[name], named[other]
    shared = [d for d in mine if d in theirs]
    return {
        "other": other,
        "names": _group(shared),
        "bound": _group([theirs[d] for d in shared]),
        "got": _group([mine[d] for d in shared]),
    }


def _group(items: Sequence[object]) -> str:
    """One item as itself, several as a tuple: ``B``, ``(B, V)``."""
    return str(items[0]) if len(items) == 1 else f"({', '.join(map(str, items))})"


def _format(
    template: str,
    tensors: Mapping[str, tuple[object, str]],
    name: str,
    known: Mapping[str, int],
    fields: Mapping[str, Any],
) -> str:
    """``template`` filled with the fields of :func:`check_shapes`' doc (``known``: the sizes bound so far)."""
    values = {n: x for n, (x, _) in tensors.items()}
    shapes = {n: tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__ for n, x in values.items()}
    dtypes = {n: getattr(x, "dtype", None) for n, x in values.items()}
    devices = {n: getattr(x, "device", None) for n, x in values.items()}
    return template.format(
        name=name,
        shape=shapes[name],
        dtype=dtypes[name],
        device=devices[name],
        dims=dict(known),
        shapes=shapes,
        dtypes=dtypes,
        devices=devices,
        **fields,
    )


def check_rotations(R: Tensor, what: str, *, error: type[InputError] = InputError, atol: float = 1e-3) -> None:
    """``R`` ``(..., 3, 3)`` holds proper rotations (``|R^T R - I| <= atol`` and ``det R > 0``), else
    ``error`` naming ``what``. Reads the values; skipped while ``torch.compile`` traces."""
    if not checking_values():
        return
    eye = torch.eye(3, dtype=R.dtype, device=R.device)
    err = (R.transpose(-1, -2) @ R - eye).abs().amax()
    if err > atol or (torch.linalg.det(R) <= 0).any():
        raise error(f"{what} must hold proper rotations (|R^T R - I| = {float(err):.3g}, det > 0)")
