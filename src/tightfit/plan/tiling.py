"""Moved: fused tiling is techniques/tiling/ (groups, draft, search). This module keeps the old
import path for code on other branches until they are merged; new code imports
tightfit.techniques.tiling."""
from tightfit.techniques.tiling import *  # noqa: F401,F403
from tightfit.techniques.tiling import __all__  # noqa: F401
