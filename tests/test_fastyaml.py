"""The one place that chooses libyaml: the C counterparts of PyYAML's safe loader and dumper, nothing else."""

from __future__ import annotations

import pytest
import yaml

from repro.fastyaml import libyaml


def test_libyaml_is_the_safe_loader_and_dumpers_c_counterpart() -> None:
    assert libyaml(yaml.SafeLoader) is getattr(yaml, "CSafeLoader", None)
    assert libyaml(yaml.SafeDumper) is getattr(yaml, "CSafeDumper", None)
    assert yaml.__with_libyaml__, "PyYAML without libyaml here: the kit reads and writes with the pure classes"
    doc = {"name": "x", "cells": [{"gpus": 8, "precision": "amp"}], "note": "a: b # c"}
    text = yaml.dump(doc, Dumper=libyaml(yaml.SafeDumper), sort_keys=False)
    assert text == yaml.dump(doc, Dumper=yaml.SafeDumper, sort_keys=False)
    assert yaml.load(text, Loader=libyaml(yaml.SafeLoader)) == doc


@pytest.mark.parametrize("unsafe", [yaml.Loader, yaml.FullLoader, yaml.Dumper])
def test_libyaml_never_gives_an_unsafe_class(unsafe: type) -> None:
    with pytest.raises(ValueError, match="neither yaml.SafeLoader nor yaml.SafeDumper"):
        libyaml(unsafe)
