"""The package's PEP 517 build backend: setuptools', with the build's code revision.

It is setuptools' own backend, loaded from the source tree so that ``pyproject.toml``'s
``[tool.setuptools.cmdclass]`` can name :class:`buildsupport.revision.BuildPy` (a build
backend's import path holds only what ``backend-path`` names).
"""

from setuptools.build_meta import *  # noqa: F403 (the hooks, unchanged)
