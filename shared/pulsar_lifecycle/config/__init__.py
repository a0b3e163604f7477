"""Configuration, declared once.

* settings.py: `setting()` fields (userConfig key, default, meaning, bounds) and the one set of
  converters every function's config class uses; exceptions.py: ConfigError.
* function_config.py: the FunctionConfig schema (field names and types) and its loader;
  validate.py: `pulsar-lifecycle validate` over that schema.

Submodules are imported by name (nothing is re-exported here), so a config class in a low layer
does not load the YAML loader or the validator.
"""
from __future__ import annotations

__all__: list = []
