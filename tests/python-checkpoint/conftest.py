"""Makes tests/python's driver_support importable here (appended, so this folder's own
modules come first); peers spawned by the tests inherit the path."""

import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))
