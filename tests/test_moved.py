"""Old module paths (repro._moved.MOVED) stay importable for one release: each gives the module at its
new place and a DeprecationWarning naming it."""

import importlib
import importlib.util
import sys

import pytest

from repro._moved import MOVED

TORCH_FREE = {old: new for old, new in MOVED.items()
              if new in ("repro.paths", "repro.tables", "repro.published_fits")}


@pytest.mark.parametrize("old", sorted(TORCH_FREE))
def test_an_old_path_imports_the_new_module_with_a_deprecation_warning(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=MOVED[old].replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


def test_every_new_place_exists():
    for new in MOVED.values():
        assert importlib.util.find_spec(new) is not None, new
