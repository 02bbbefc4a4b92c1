"""Typed, validated reads from a Hugging Face `config.json` dict, with a family's defaults.

A key missing from the dict takes the default its transformers config class declares
(passed in as `defaults`); a key in neither is a missing required key. Keys may have
legacy aliases that, when present, take precedence (as the config classes' `__post_init__`
pops them). Every failure is a ValueError naming the family and the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

_MISSING: Final = object()


class ConfigReader:
    """Read keys of one config dict as ints, floats, bools, strings, lists or mappings.

    Args:
        config: the parsed `config.json` (or `PretrainedConfig.to_dict()`).
        defaults: key -> default value of the family's transformers config class.
        family: model_type, used in error messages.
        aliases: key -> legacy names that override it when present in `config`.
    """

    def __init__(
        self,
        config: Mapping[str, object],
        defaults: Mapping[str, object],
        family: str,
        aliases: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        self._config = config
        self._defaults = defaults
        self._family = family
        self._aliases: Mapping[str, tuple[str, ...]] = aliases or {}

    @property
    def family(self) -> str:
        """The model_type this reader names in its errors."""
        return self._family

    def has(self, key: str) -> bool:
        """True when `key` (or one of its aliases) is present in the config dict itself."""
        return any(k in self._config for k in (*self._aliases.get(key, ()), key))

    def raw(self, key: str) -> object:
        """The value of `key`: an alias's, else the dict's (None included), else the default."""
        for name in (*self._aliases.get(key, ()), key):
            if name in self._config:
                return self._config[name]
        value = self._defaults.get(key, _MISSING)
        if value is _MISSING:
            raise ValueError(f"{self._family} config is missing required key {key!r}")
        return value

    def _fail(self, key: str, value: object, expected: str) -> ValueError:
        return ValueError(f"{self._family} config key {key!r} must be {expected}, got {value!r}")

    def opt_int(self, key: str) -> int | None:
        """An int (integral floats accepted), or None when the value is null."""
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, bool):
            raise self._fail(key, value, "an int")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        raise self._fail(key, value, "an int")

    def req_int(self, key: str) -> int:
        """A non-null int."""
        value = self.opt_int(key)
        if value is None:
            raise self._fail(key, value, "an int (it is null)")
        return value

    def pos_int(self, key: str) -> int:
        """An int > 0 (a size that is divided by)."""
        value = self.req_int(key)
        if value <= 0:
            raise self._fail(key, value, "a positive int")
        return value

    def int_or_auto(self, key: str) -> int | None:
        """An int, or None when the value is the string "auto" (derive it) or null."""
        value = self.raw(key)
        if value == "auto":
            return None
        return self.opt_int(key)

    def req_float(self, key: str) -> float:
        """A number (int or float, not a bool), as a float."""
        return self._number(key, self.raw(key))

    def _number(self, key: str, value: object) -> float:
        # transformers writes non-finite floats as {"__float__": "Infinity"}
        if isinstance(value, Mapping) and isinstance(value.get("__float__"), str):
            try:
                return float(value["__float__"])
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(key, value, "a number")
        return float(value)

    def float_pair(self, key: str) -> tuple[float, float]:
        """A list of two numbers (e.g. a time-step limit)."""
        value = self.raw(key)
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise self._fail(key, value, "a pair of numbers")
        return self._number(key, value[0]), self._number(key, value[1])

    def int_tuple(self, key: str) -> tuple[int, ...]:
        """An int or a list of ints as a tuple; null is the empty tuple."""
        value = self.raw(key)
        items = () if value is None else value if isinstance(value, (list, tuple)) else (value,)
        out: list[int] = []
        for v in items:
            if isinstance(v, bool) or not isinstance(v, int):
                raise self._fail(key, value, "an int or a list of ints")
            out.append(v)
        return tuple(out)

    def mapping(self, key: str) -> Mapping[str, object]:
        """A mapping (e.g. rope_parameters)."""
        value = self.raw(key)
        if not isinstance(value, Mapping):
            raise self._fail(key, value, "a mapping")
        return value

    def flag(self, key: str) -> bool:
        """A bool."""
        value = self.raw(key)
        if not isinstance(value, bool):
            raise self._fail(key, value, "a bool")
        return value

    def opt_str(self, key: str) -> str | None:
        """A string, or None when the value is null."""
        value = self.raw(key)
        if value is None or isinstance(value, str):
            return value
        raise self._fail(key, value, "a string")

    def req_str(self, key: str) -> str:
        """A non-null string."""
        value = self.opt_str(key)
        if value is None:
            raise self._fail(key, value, "a string (it is null)")
        return value

    def opt_str_list(self, key: str) -> list[str] | None:
        """A list of strings, or None when the value is null."""
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return [str(v) for v in value]
        raise self._fail(key, value, "a list of strings")

    def opt_int_list(self, key: str) -> list[int] | None:
        """A list of ints, or None when the value is null."""
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            return [int(v) for v in value]
        raise self._fail(key, value, "a list of ints")
