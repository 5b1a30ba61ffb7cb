"""ALFWorld tests: alfworld's import creates $ALFWORLD_DATA, so it points at a temporary folder for the session."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile

_DATA = tempfile.mkdtemp(prefix="alfworld-data-")
os.environ["ALFWORLD_DATA"] = _DATA
atexit.register(shutil.rmtree, _DATA, True)

if importlib.util.find_spec("alfworld") is None:
    # Without the [alfworld] extra only the engine-free parts can be tested.
    collect_ignore_glob = [
        "test_env.py",
        "test_engine.py",
        "test_games.py",
        "test_generate.py",
        "test_walkthroughs.py",
    ]
