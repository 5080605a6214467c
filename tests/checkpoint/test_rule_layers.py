"""Each check of the widened rule on its own: the scanner, the loader's resolver and the policy overlap,
so a check that only one stream exercises end to end can go missing unnoticed while another layer still refuses.
Here each is called directly, with a rule that has nothing else to refuse.
"""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from snapcell.checkpoint import GlobalRule, global_refusal
from snapcell.checkpoint._findglobal import _class_dunder, make_find_global

EVERYTHING = GlobalRule(allow_module=lambda _module: True)


def test_names_only_modules_admit_their_listed_names_only() -> None:
    assert global_refusal("copy", "deepcopy", EVERYTHING) is None
    assert global_refusal("copy", "dispatch_table", EVERYTHING) is not None


def test_an_alias_is_allowed_only_when_its_public_twin_is() -> None:
    assert global_refusal("_operator", "getitem", EVERYTHING) is None
    assert global_refusal("_operator", "getitem", GlobalRule(allow_module=lambda m: m != "operator")) is not None


def test_class_dunders_only_below_a_class() -> None:
    assert global_refusal("json", "JSONEncoder.__repr__", EVERYTHING) is None
    assert global_refusal("json", "dumps.__new__", EVERYTHING) is not None  # function.__new__ makes functions
    assert global_refusal("json", "__repr__", EVERYTHING) is not None  # a module's, not a class's
    assert global_refusal("json", "JSONEncoder.__new__.__repr__", EVERYTHING) is not None  # the last part only
    assert _class_dunder(json.JSONEncoder, "__repr__") is json.JSONEncoder.__repr__
    with pytest.raises(pickle.UnpicklingError, match="other than a class"):
        _class_dunder(json.dumps, "__new__")  # the resolver's own check, for a module not imported at the rule


def test_the_loader_s_getattr_of_a_module_follows_the_rule_for_globals() -> None:
    getattr_ = make_find_global(EVERYTHING)("builtins", "getattr")
    assert getattr_(copy, "deepcopy") is copy.deepcopy
    with pytest.raises(pickle.UnpicklingError, match="dispatch_table"):
        getattr_(copy, "dispatch_table")
