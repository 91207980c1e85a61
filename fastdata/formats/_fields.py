"""Fields with alternatives: "the image is whichever of jpg, jpeg, png or webp the sample has".

Web-scraped shards store some images as ``.jpg`` and others as ``.png``; samples with different member
names do not batch (torch's collate stops at the first sample without ``jpg``). webdataset spells the
choice ``to_tuple("jpg;png", "cls")`` or ``rename(image="jpg;png")``; fastdata takes the same spelling as a
dataset option, ``fields={"image": "jpg;jpeg;png;webp", "label": "cls"}``: each field is the first of its
alternatives the sample has. Only the fields named are kept (with ``__key__`` and ``__url__``), so every
sample has the same keys and batches. :class:`Fields` runs after decoding (the decoder tells an image by
its extension), and a sample with none of a field's alternatives is a bad sample, subject to the
dataset's ``on_error``, named with its shard and what it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastdata.core.errors import BadSample, ConfigError

FieldSpec = Mapping[str, str | list[str] | tuple[str, ...]] | str


class MissingField(BadSample):
    """A sample has none of the alternatives of a field given in ``fields=``."""


class Fields:
    """Pick each field of a sample from its alternatives, and rename it.

    Args:
        spec (dict | str): ``{"image": "jpg;jpeg;png;webp", "label": "cls"}`` (alternatives separated by
            ``;`` or given as a list, tried in order), or the same as text, ``"image=jpg;png,label=cls"``
            (a name without ``=`` keeps its name: ``"jpg;png,cls"`` gives fields ``jpg`` and ``cls``).

    Raises:
        ConfigError: the spec names no field, or a field has no alternative.
    """

    __slots__ = ("choices",)

    def __init__(self, spec: FieldSpec | Fields) -> None:
        if isinstance(spec, Fields):
            self.choices: tuple[tuple[str, tuple[str, ...]], ...] = spec.choices
            return
        items: list[tuple[Any, Any]]
        if isinstance(spec, str):
            pairs = [part.partition("=") for part in spec.split(",") if part.strip()]
            items = [(name if sep else name.split(";")[0], alts if sep else name) for name, sep, alts in pairs]
        elif isinstance(spec, Mapping):
            items = list(spec.items())
        else:
            raise ConfigError(
                f"fields={spec!r}: give a dict like {{'image': 'jpg;jpeg;png;webp', 'label': 'cls'}}, or text "
                "like 'image=jpg;png,label=cls'"
            )
        choices = []
        for name, alts in items:
            names = alts.split(";") if isinstance(alts, str) else list(alts)
            names = [a.strip().lstrip(".").lower() for a in names if isinstance(a, str) and a.strip()]
            if not isinstance(name, str) or not name.strip() or not names:
                raise ConfigError(
                    f"fields={spec!r}: field {name!r} needs a name and at least one extension, like "
                    "'image': 'jpg;jpeg;png;webp'"
                )
            choices.append((name.strip(), tuple(names)))
        if not choices:
            raise ConfigError(f"fields={spec!r} names no field; like {{'image': 'jpg;jpeg;png;webp'}}")
        self.choices = tuple(choices)

    def __repr__(self) -> str:
        return "Fields({" + ", ".join(f"{n!r}: {';'.join(a)!r}" for n, a in self.choices) + "})"

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in sample.items() if k.startswith("__")}
        for name, alts in self.choices:
            for alt in alts:
                if alt in sample:
                    out[name] = sample[alt]
                    break
            else:
                raise self._missing(sample, name, alts)
        return out

    def _missing(self, sample: dict[str, Any], name: str, alts: tuple[str, ...]) -> MissingField:
        url = str(sample.get("__url__", ""))
        where = f"{url}: " if url else ""
        has = ", ".join(f".{k}" for k in sample if not k.startswith("__")) or "no member"
        return MissingField(
            f"{where}sample {sample.get('__key__', '?')!r} has none of {', '.join('.' + a for a in alts)} for field "
            f"{name!r} (it has {has}); add its extension to fields= ({name!r}: '{';'.join(alts)};...'), or "
            "on_error='skip' to leave such samples out",
            url,
        )


def with_fields(
    fields: FieldSpec | Fields | None, decoder: Callable[[dict[str, Any]], dict[str, Any]] | None
) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """``decoder`` followed by the choice of ``fields`` (none: ``decoder`` as it is)."""
    if fields is None:
        return decoder
    pick = Fields(fields)
    return pick if decoder is None else _DecodeThenPick(decoder, pick)


class _DecodeThenPick:
    """A picklable ``pick(decoder(sample))`` (datasets go to spawn workers by pickle)."""

    __slots__ = ("decoder", "pick")

    def __init__(self, decoder: Callable[[dict[str, Any]], dict[str, Any]], pick: Fields) -> None:
        self.decoder, self.pick = decoder, pick

    def __getstate__(self) -> tuple[Any, Fields]:
        return self.decoder, self.pick

    def __setstate__(self, state: tuple[Any, Fields]) -> None:
        self.decoder, self.pick = state

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return self.pick(self.decoder(sample))

    def __repr__(self) -> str:
        return f"{self.decoder!r} then {self.pick!r}"


__all__ = ["FieldSpec", "Fields", "MissingField", "with_fields"]
