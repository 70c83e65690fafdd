"""The one typed experiment config, loaded from YAML and `key.sub=value` overrides.

load.py       loading: a file or a shipped config by name, overrides, saving
schema.py     the sections (dataclasses) and the run's hash
builder.py    building any dataclass from a mapping; YAML; overrides; ranges
checks.py     the ranges of every number and the checks across keys
"""
