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


# Private names, with no policy to hide them (EVERYTHING allows every module and hides nothing): the rule's own
# check is all that refuses them, in the scanner and the loader alike.
PRIVATE_GLOBALS = [
    ("json", "_default_encoder"),  # a private name of a module
    ("random", "Random._randbelow"),  # a private part below a public class
    ("concurrent.futures._base", "Future"),  # a public name of a private module
]


@pytest.mark.parametrize(("module", "name"), PRIVATE_GLOBALS, ids=["name", "part", "module"])
def test_private_names_are_refused_by_the_rule_alone(module: str, name: str) -> None:
    from snapcell.checkpoint.scan import scan_pickle

    assert global_refusal(module, name, EVERYTHING) in ("a private name", "a private module")
    raw_module, raw_name = module.encode(), name.encode()
    stream = b"\x80\x04\x8c" + bytes([len(raw_module)]) + raw_module + b"\x8c" + bytes([len(raw_name)]) + raw_name
    refusal = scan_pickle(stream + b"\x93.", EVERYTHING)
    assert refusal is not None and "private" in refusal.reason, refusal
    with pytest.raises(pickle.UnpicklingError, match="private"):
        make_find_global(EVERYTHING)(module, name)


def _short(text: str) -> bytes:
    return b"\x8c" + bytes([len(text)]) + text.encode()


@pytest.mark.parametrize("name", ["_randbelow", "__init__", "__class__"])
def test_getattr_of_a_private_attribute_is_refused_without_a_policy(name: str) -> None:
    import random

    from snapcell.checkpoint.scan import scan_pickle

    getattr_ = make_find_global(EVERYTHING)("builtins", "getattr")
    assert getattr_(random.Random, "random") is random.Random.random
    with pytest.raises(pickle.UnpicklingError, match="private"):
        getattr_(random.Random, name)
    # getattr(random.Random, name), as a stream: the scanner's check of the attribute, the same rule.
    read = _short("builtins") + _short("getattr") + b"\x93" + _short("random") + _short("Random") + b"\x93"
    stream = b"\x80\x04" + read + _short(name) + b"\x86R."
    refusal = scan_pickle(stream, EVERYTHING)
    assert refusal is not None and "private" in refusal.reason, refusal
    public = b"\x80\x04" + read + _short("random") + b"\x86R."
    assert scan_pickle(public, EVERYTHING) is None
