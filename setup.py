"""Everything is in pyproject.toml, but for one file: abicache-dropin.pth, put
at the top of site-packages, where Python runs it at start-up (ABICACHE_DROPIN,
see src/abicache/dropin.py)."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "abicache-dropin.pth"


class BuildWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildWithPth})
