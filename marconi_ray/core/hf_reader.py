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
    """Read keys of one config dict as ints, bools, strings or lists.

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

    def int_or_auto(self, key: str) -> int | None:
        """An int, or None when the value is the string "auto" (derive it) or null."""
        value = self.raw(key)
        if value == "auto":
            return None
        return self.opt_int(key)

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
